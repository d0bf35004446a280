"""Helpers for the rollout tests that run against the real broker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml

from tests.read_topic import read_all  # noqa: F401 — the rollout tests import it from here


def write_config(path: Path, namespace: str, **sections) -> Path:
    path.write_text(yaml.safe_dump({"namespace": namespace, "model": {"source": "tiny"}, **sections}))
    return path


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def config_path(tmp_path, namespace):
    def make(**sections) -> Path:
        return write_config(tmp_path / "run.yaml", namespace, **sections)
    return make
