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


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    from tests.vllm.tiny_llama import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
