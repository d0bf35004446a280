"""Plugin code is imported only from what a config names, and a bad name is a config error naming the field."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from undertow.infra.run.config import load_component_config
from undertow.kernel.config_io import ConfigError

ROOT = Path(__file__).resolve().parents[2]

# In a fresh interpreter: load a built-ins-only config first (the framework imports its own built-ins
# lazily), then the config under test, and print what that second load imported.
LOAD_TWICE = """
import json, sys
from undertow.infra.run.config import load_component_config
load_component_config(sys.argv[1])
before = set(sys.modules)
load_component_config(sys.argv[2])
print(json.dumps(sorted(set(sys.modules) - before)))
"""

# Every module of the user's package logs its own import, so a stray import shows up even if undone.
LOGS_ITS_IMPORT = "import os\nopen(os.environ['PROBE_LOG'], 'a').write(__name__ + '\\n')\n"


@pytest.fixture
def user_package(tmp_path: Path) -> Path:
    """`my_lab/` as a user would write it: a processor, a non-callable, and a module nobody names."""
    pkg = tmp_path / "lib" / "my_lab"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(LOGS_ITS_IMPORT)
    (pkg / "filters.py").write_text(LOGS_ITS_IMPORT + "LIMIT = 3\n\ndef keep(exp):\n    return exp\n")
    (pkg / "other.py").write_text(LOGS_ITS_IMPORT + "def keep(exp):\n    return exp\n")
    return pkg.parent


def config(tmp_path: Path, name: str, **sections) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(sections))
    return path


def test_a_dotted_path_imports_that_module_and_nothing_else(tmp_path, user_package):
    base = config(tmp_path, "base.yaml", processors={"pipeline": ["clean", "reshape"]})
    named = config(tmp_path, "named.yaml", processors={"pipeline": ["clean", "my_lab.filters.keep", "reshape"]})
    log = tmp_path / "imports.log"
    env = {**os.environ, "PYTHONPATH": f"{user_package}{os.pathsep}{ROOT}", "PROBE_LOG": str(log)}
    out = subprocess.run([sys.executable, "-c", LOAD_TWICE, str(base), str(named)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout) == ["my_lab", "my_lab.filters"]
    # The package itself runs on the way in (Python imports parents); its other modules never do.
    assert log.read_text().split() == ["my_lab", "my_lab.filters"]


@pytest.mark.parametrize("entry, why", [
    ("my_lab.nowhere.keep", "cannot import it (No module named 'my_lab.nowhere')"),
    ("my_lab.filters.kept", "cannot import it (module 'my_lab.filters' has no attribute 'kept')"),
    ("my_lab.filters.LIMIT", "expected a function or class, got int"),
])
def test_a_bad_dotted_path_is_a_config_error_naming_the_field(tmp_path, user_package, monkeypatch, entry, why):
    monkeypatch.syspath_prepend(str(user_package))
    monkeypatch.setenv("PROBE_LOG", str(tmp_path / "imports.log"))
    for name in [m for m in sys.modules if m == "my_lab" or m.startswith("my_lab.")]:
        monkeypatch.delitem(sys.modules, name)  # each case gets this test's copy of my_lab

    path = config(tmp_path, "proc.yaml", processors={"pipeline": ["clean", entry]})
    with pytest.raises(ConfigError) as err:
        load_component_config(path)
    assert f"{path}: processors.pipeline: processor '{entry}': {why}" in str(err.value)

    path = config(tmp_path, "train.yaml", trainer={"algorithm": {"policy_loss": entry}})
    with pytest.raises(ConfigError) as err:
        load_component_config(path)
    assert f"{path}: trainer.algorithm.policy_loss: policy loss '{entry}': {why}" in str(err.value)
