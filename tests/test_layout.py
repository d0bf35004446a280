"""The repository's shape: the import rule between packages, and the README's commands and paths."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kernel", "schemas", "streams", "processors", "rollout", "trainer", "watchers", "infra")
# Arrows run one way: {kernel, schemas} ← streams ← {processors, rollout, trainer, watchers} ← infra; the kernel
# (registry, config files, model builders) and the contracts stand side by side at the bottom.
MAY_IMPORT = {
    "kernel": set(),
    "schemas": set(),
    "streams": {"kernel", "schemas"},
    "processors": {"kernel", "schemas", "streams"},
    "rollout": {"kernel", "schemas", "streams"},
    "trainer": {"kernel", "schemas", "streams"},
    "watchers": {"kernel", "schemas", "streams"},  # side consumers: they meet the stages on topics
    "infra": set(PACKAGES),
}


def imported_packages(path: Path, among: set[str] | tuple[str, ...] = PACKAGES) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & set(among)


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_follow_the_architecture(package):
    files = list((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no Python files"
    for path in files:
        wrong = imported_packages(path) - MAY_IMPORT[package] - {package}
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"


KAFKA_CLIENTS = {"kafka", "aiokafka", "faust"}  # kafka-python, and Faust with the client under it


@pytest.mark.parametrize("package", [p for p in PACKAGES if p != "streams"])
def test_components_leave_the_kafka_clients_to_streams(package):
    """Consuming, assigning, seeking, pausing, offsets and lag are streams' (RecordConsumer, GroupLag,
    streams.admin), not each component's: benchmarks may measure the raw clients, nothing else."""
    users = {}
    for path in (ROOT / package).rglob("*.py"):
        clients = imported_packages(path, among=KAFKA_CLIENTS)
        if clients:
            users[str(path.relative_to(ROOT))] = sorted(clients)
    assert not users, f"Kafka clients imported outside streams/: {users}"


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [next(line for line in b.splitlines() if line and not line.startswith("#")) for b in blocks[:2]]


def test_ci_runs_the_readme_test_command():
    _, test_command = readme_commands()
    assert "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_readme_paths_exist():
    text = (ROOT / "README.md").read_text()
    paths = set(re.findall(r"`((?:schemas|streams|processors|rollout|trainer|watchers|infra|tests|examples|benchmarks)/[^`\s]*)`", text))
    assert len(paths) >= 8
    missing = sorted(p for p in paths if not (ROOT / p).exists())
    assert not missing, f"README names paths that do not exist: {missing}"


def test_readme_first_command_uses_commands_that_exist():
    import click
    from typer.main import get_command

    from infra.cli import app

    main_command, _ = readme_commands()
    assert "undertow run examples/demo.yaml" in main_command and (ROOT / "examples" / "demo.yaml").exists()
    group = get_command(app)
    for use in re.findall(r"undertow ((?:[\w-]+ ?)+)", main_command):
        words = use.split()
        assert words[0] in group.commands, f"README runs `undertow {use}`"
        sub = group.commands[words[0]]
        if isinstance(sub, click.Group):
            assert words[1] in sub.commands, f"README runs `undertow {use}`"


SHIPPED_CONFIGS = 7  # examples/**/*.yaml: a config added or removed must be counted here


def test_every_shipped_config_loads_and_builds_its_pipelines():
    from infra.run_config import load_run_config, stage_mapping
    from processors.config import ProcessorsConfig
    from processors.pipeline import Pipeline

    configs = sorted((ROOT / "examples").rglob("*.yaml"))
    assert len(configs) == SHIPPED_CONFIGS, [str(c.relative_to(ROOT)) for c in configs]
    for path in configs:
        config, raw = load_run_config(path)
        for stage in list(config.run.stages) or [None]:
            section = ProcessorsConfig.model_validate(stage_mapping(raw, stage).get("processors") or {})
            pipeline = Pipeline.from_config(section.pipeline)  # registry names and kwargs, no broker
            assert len(pipeline.stages) >= 1, (path, stage)


def test_every_top_level_package_is_installed():
    """The `undertow` command imports from the installed packages, not from the checkout: a folder
    missing from pyproject's include list works under `python -m` here and breaks the command."""
    import fnmatch
    import tomllib

    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = sorted(p.parent.name for p in ROOT.glob("*/__init__.py") if p.parent.name != "tests")
    missing = [p for p in packages if not any(fnmatch.fnmatch(p, pattern) for pattern in include)]
    assert not missing, f"pyproject.toml [tool.setuptools.packages.find] include lacks {missing}"
