"""Which interpreter `undertow run` starts the rollout workers with: vllm has its own environment."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from undertow.infra.rollout_env import VLLM_PYTHON_ENV, eval_command, rollout_command
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
    assert rollout_command(rollout(engine)) == [sys.executable, "-m", "undertow.infra.cli_rollout"]
    assert eval_command(rollout(engine)) == [sys.executable, "-m", "undertow.infra.cli"]


def test_vllm_runs_in_the_vllm_environment_through_the_faust_free_entry_point(tmp_path, monkeypatch):
    monkeypatch.delenv(VLLM_PYTHON_ENV, raising=False)
    monkeypatch.setenv("UNDERTOW_CACHE", str(tmp_path))
    python = tmp_path / "vllm-venv" / "bin" / "python"
    with pytest.raises(RuntimeError, match="bash infra/bootstrap.sh --vllm"):
        rollout_command(rollout({"name": "vllm", "seed": 1}))
    python.parent.mkdir(parents=True)
    python.touch()
    assert rollout_command(rollout("vllm")) == [str(python), "-m", "undertow.infra.cli_rollout"]
    assert eval_command(rollout("vllm")) == [str(python), "-m", "undertow.infra.cli"]  # it builds the engine too
    # The engine says where it runs, not its name: a plugin engine for the vLLM environment goes there too.
    assert rollout_command(rollout(f"{__name__}.VLLMBackedEngine"))[0] == str(python)
    monkeypatch.setenv(VLLM_PYTHON_ENV, "/opt/other/python")
    assert rollout_command(rollout("vllm"))[0] == "/opt/other/python"


def test_the_rollout_entry_point_imports_neither_faust_nor_deepspeed():
    import subprocess

    heavy = "sorted(m for m in sys.modules if m.removeprefix('undertow.').split('.')[0] in {})"
    code = ("import sys, undertow.infra.cli_rollout, undertow.rollout.main, undertow.rollout.worker; "
            f"print({heavy.format(('faust', 'deepspeed', 'trainer', 'processors'))}); "
            # the run file's one model validates every section, theirs too, with their config modules only
            "from undertow.infra.cli_common import run_config; run_config('examples/smollm2_vllm.yaml'); "
            f"print({heavy.format(('faust', 'deepspeed', 'aiokafka'))})")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT).stdout
    assert out.split() == ["[]", "[]"], out
