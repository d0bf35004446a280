"""Fixtures for the rollout tests that run against the real broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import write_config


@pytest.fixture
def config_path(tmp_path, namespace):
    def make(**sections) -> Path:
        return write_config(tmp_path / "run.yaml", namespace, **sections)
    return make
