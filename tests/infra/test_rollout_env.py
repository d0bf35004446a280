"""Which interpreter `undertow run` starts the rollout workers with: vllm has its own environment."""

from __future__ import annotations

import sys

import pytest
import yaml

from infra.rollout_env import VLLM_PYTHON_ENV, eval_command, rollout_command


def config(tmp_path, engine) -> str:
    path = tmp_path / "stage.yaml"
    path.write_text(yaml.safe_dump({"rollout": {"engine": engine}} if engine else {}))
    return str(path)


@pytest.mark.parametrize("engine", [None, "transformers", {"name": "transformers", "batch_size": 4}])
def test_other_engines_run_in_this_interpreter_through_the_whole_cli(tmp_path, engine):
    assert rollout_command(config(tmp_path, engine)) == [sys.executable, "-m", "infra.cli"]


def test_vllm_runs_in_the_vllm_environment_through_the_faust_free_entry_point(tmp_path, monkeypatch):
    monkeypatch.delenv(VLLM_PYTHON_ENV, raising=False)
    monkeypatch.setenv("UNDERTOW_CACHE", str(tmp_path))
    python = tmp_path / "vllm-venv" / "bin" / "python"
    with pytest.raises(RuntimeError, match="bash infra/bootstrap.sh --vllm"):
        rollout_command(config(tmp_path, {"name": "vllm", "seed": 1}))
    python.parent.mkdir(parents=True)
    python.touch()
    assert rollout_command(config(tmp_path, "vllm")) == [str(python), "-m", "infra.cli_rollout"]
    assert eval_command(config(tmp_path, "vllm")) == [str(python), "-m", "infra.cli"]  # it builds the engine too
    assert eval_command(config(tmp_path, "transformers")) == [sys.executable, "-m", "infra.cli"]
    monkeypatch.setenv(VLLM_PYTHON_ENV, "/opt/other/python")
    assert rollout_command(config(tmp_path, "vllm"))[0] == "/opt/other/python"


def test_the_rollout_entry_point_imports_neither_faust_nor_deepspeed():
    import subprocess

    code = ("import sys, infra.cli_rollout, rollout.main, rollout.worker; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('faust', 'deepspeed', 'trainer', 'processors')))")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
