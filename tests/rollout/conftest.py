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


@pytest.fixture(scope="session")
def scripted_weights(tmp_path_factory) -> Path:
    """The tiny model that replays one tool-using conversation (tests/rollout/scripted_model.py), trained once."""
    from tests.rollout.scripted_model import train_scripted

    return train_scripted(tmp_path_factory.mktemp("scripted") / "model.safetensors")
