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


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def imported_packages(path: Path, among: set[str] | tuple[str, ...] = PACKAGES) -> set[str]:
    """The packages of `among` that `path` imports: layout packages by their `undertow.` name, others as named."""
    names = {m.removeprefix("undertow.").split(".")[0] for m in imported_modules(path)}
    return names & set(among)


def test_the_layout_is_imported_only_under_undertow():
    """`import schemas` would work from the checkout and load a second copy of every class beside
    undertow.schemas' (records that fail isinstance, registries filled twice); installed, it fails."""
    bare = {}
    for path in ROOT.rglob("*.py"):
        if {".git", "__pycache__", "runs"} & set(path.relative_to(ROOT).parts):
            continue
        wrong = {m for m in imported_modules(path) if m.split(".")[0] in PACKAGES}
        if wrong:
            bare[str(path.relative_to(ROOT))] = sorted(wrong)
    assert not bare, f"layout packages imported without undertow.: {bare}"


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

    from undertow.infra.cli import app

    main_command, _ = readme_commands()
    assert "undertow run examples/demo.yaml" in main_command and (ROOT / "examples" / "demo.yaml").exists()
    group = get_command(app)
    for use in re.findall(r"undertow ((?:[\w-]+ ?)+)", main_command):
        words = use.split()
        assert words[0] in group.commands, f"README runs `undertow {use}`"
        sub = group.commands[words[0]]
        if isinstance(sub, click.Group):
            assert words[1] in sub.commands, f"README runs `undertow {use}`"


SHIPPED_CONFIGS = 9  # examples/**/*.yaml: a config added or removed must be counted here


def test_every_shipped_config_loads_and_builds_its_pipelines():
    from undertow.infra.run.config import load_run_config, stage_mapping
    from undertow.processors.config import ProcessorsConfig
    from undertow.processors.pipeline import Pipeline

    configs = sorted((ROOT / "examples").rglob("*.yaml"))
    assert len(configs) == SHIPPED_CONFIGS, [str(c.relative_to(ROOT)) for c in configs]
    for path in configs:
        config, raw = load_run_config(path)
        for stage in list(config.run.stages) or [None]:
            section = ProcessorsConfig.model_validate(stage_mapping(raw, stage).get("processors") or {})
            pipeline = Pipeline.from_config(section.pipeline)  # registry names and kwargs, no broker
            assert len(pipeline.stages) >= 1, (path, stage)


def test_the_wheel_holds_one_top_level_package_with_every_module(tmp_path):
    """pip install takes no generic names (schemas, streams, trainer, …) into site-packages: the wheel's
    one package is `undertow`, and every module of the layout's folders is in it, with the broker's files."""
    import shutil
    import subprocess
    import sys
    import zipfile

    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    for package in PACKAGES:  # a copy: the build leaves build/ and *.egg-info behind
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", ".",
                           "-w", str(tmp_path / "dist")], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("undertow-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"undertow", wheel.name.split("-py")[0] + ".dist-info"}, names
    sources = {f"undertow/{p.relative_to(ROOT).as_posix()}" for package in PACKAGES
               for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts}
    assert sources - set(names) == set(), "modules left out of the wheel"
    assert {"undertow/infra/broker/kafka/pom.xml", "undertow/infra/broker/kafka/log4j2.properties"} <= set(names)
