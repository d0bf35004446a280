"""What `undertow run` starts in the vLLM environment runs there: the rollout and eval commands."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", ["rollout", "feed", "eval"])
def test_the_commands_run_in_the_vllm_environment(command):
    out = subprocess.run([sys.executable, "-m", "undertow.infra.cli", command, "--help"], cwd=ROOT,
                         capture_output=True, text=True)
    assert out.returncode == 0 and "Usage" in out.stdout, out.stderr[-2000:]


def test_the_command_line_needs_no_faust_or_deepspeed():
    import importlib.util

    assert importlib.util.find_spec("faust") is None  # this environment could not have them anyway
    code = "import undertow.infra.cli, undertow.rollout.main, undertow.rollout.worker, undertow.rollout.engines.vllm_engine"
    assert subprocess.run([sys.executable, "-c", code], cwd=ROOT).returncode == 0
