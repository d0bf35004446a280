"""pyproject's pins are what a fresh machine gets: infra/bootstrap.sh installs infra/requirements.lock
(and the --no-deps list), then the package itself with --no-deps, so a dependency pinned in pyproject
but missing from the lock is missing there. openai was (2026-12-04): on a clean machine every test
module importing it failed at collection, while machines whose venv already held it passed."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SEPARATELY = {"deepspeed"}  # bootstrap.sh installs it from pyproject's pin, against the torch installed


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    return {canonical(n): v for n, v in re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", text, re.M)}


def test_every_pinned_dependency_is_installed_by_the_bootstrap_at_its_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = pins("\n".join([*project["dependencies"], *sum(project["optional-dependencies"].values(), [])]))
    installed = pins((ROOT / "infra" / "requirements.lock").read_text()) | pins(
        (ROOT / "infra" / "requirements-nodeps.txt").read_text())
    wrong = {name: (version, installed.get(name)) for name, version in wanted.items()
             if name not in SEPARATELY and installed.get(name) != version}
    assert not wrong, f"pinned in pyproject, (pin, lock): {wrong}"
