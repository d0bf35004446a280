"""The vLLM engine's tests run in the rollout environment (bash infra/bootstrap.sh --vllm):

    ~/.cache/undertow/vllm-venv/bin/python -m pytest tests/vllm

The main environment cannot import vllm, so there they are not collected (.ci/run runs both).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("vllm") is None:
    collect_ignore_glob = ["test_*.py"]

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: the tiny model needs little


# Session-wide: the batch engine's modules (engine, async) share one start-up; each test that swaps
# weights in loads `original` back before it ends.
@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    from tests.vllm.tiny_llama import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def spec(llama_dir, tmp_path_factory):
    """The directory's model started from other weights (`init_from`, as a later stage starts): every
    comparison with the trainer's recomputation fails unless vLLM applied them too."""
    from undertow.kernel.models import ModelSpec
    from tests.vllm.tiny_llama import save_tiny_llama

    start = save_tiny_llama(tmp_path_factory.mktemp("start"), seed=5) / "model.safetensors"
    return ModelSpec(source="hf", path=str(llama_dir), init_from=str(start))


@pytest.fixture(scope="session")
def engine(spec):
    """vLLM's batch engine (one for the lane: it takes tens of seconds to start)."""
    import gc
    import time

    from undertow.rollout.engines import build_engine

    started = time.monotonic()
    engine = build_engine({"name": "vllm", "max_model_len": 512, "seed": 0}, spec)
    print(f"vLLM engine start-up: {time.monotonic() - started:.1f} s")
    yield engine
    del engine.llm
    gc.collect()


@pytest.fixture(scope="session")
def original(spec) -> bytes:
    """The spec's weights as the trainer publishes them: what a test swaps back in."""
    from undertow.kernel.models import build_model, weights_to_bytes

    return weights_to_bytes(build_model(spec))
