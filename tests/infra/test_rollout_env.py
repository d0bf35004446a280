"""Which interpreter `undertow run` starts the rollout workers with: vllm has its own environment."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from undertow.infra.run.rollout_env import VLLM_PYTHON_ENV, engine_command
from undertow.rollout.config import RolloutConfig

ROOT = Path(__file__).resolve().parents[2]


class VLLMBackedEngine:
    """A user's engine built on vLLM: it must run where vllm is installed."""

    environment = "vllm"

    def __init__(self, spec):
        self.spec = spec


def rollout(engine) -> RolloutConfig:
    return RolloutConfig.model_validate({"engine": engine} if engine else {})


@pytest.mark.parametrize("engine", [None, "transformers", {"name": "transformers", "batch_size": 4}])
def test_other_engines_run_in_this_interpreter(engine):
    assert engine_command(rollout(engine)) == [sys.executable, "-m", "undertow.infra.cli"]


def test_vllm_runs_in_the_vllm_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(VLLM_PYTHON_ENV, raising=False)
    monkeypatch.setenv("UNDERTOW_CACHE", str(tmp_path))
    python = tmp_path / "vllm-venv" / "bin" / "python"
    with pytest.raises(RuntimeError, match="bash infra/bootstrap.sh --vllm"):
        engine_command(rollout({"name": "vllm", "seed": 1}))
    python.parent.mkdir(parents=True)
    python.touch()
    assert engine_command(rollout("vllm")) == [str(python), "-m", "undertow.infra.cli"]
    # The engine says where it runs, not its name: a plugin engine for the vLLM environment goes there too.
    assert engine_command(rollout(f"{__name__}.VLLMBackedEngine"))[0] == str(python)
    monkeypatch.setenv(VLLM_PYTHON_ENV, "/opt/other/python")
    assert engine_command(rollout("vllm"))[0] == "/opt/other/python"


def test_the_command_line_imports_neither_faust_nor_deepspeed():
    """What the vLLM environment runs (`python -m undertow.infra.cli rollout|eval`) must import there:
    the commands, the rollout stage and the run file's one model, which validates every section with
    its config module only."""
    import subprocess

    code = ("import sys, undertow.infra.cli, undertow.rollout.main, undertow.rollout.worker; "
            "from undertow.infra.cli.common import run_config; run_config('examples/smollm2_vllm.yaml'); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('faust', 'deepspeed', 'aiokafka')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT).stdout
    assert out.split() == ["[]"], out
