"""Inference engines behind one interface: generate n samples per prompt, load new weights."""

from undertow.rollout.engines.base import Engine, Sample, SamplingParams, engines, build_engine
from undertow.rollout.engines import transformers_engine as _transformers  # noqa: F401  (registers "transformers")
from undertow.rollout.engines import vllm_engine as _vllm  # noqa: F401  (registers "vllm"; imports vllm lazily)
from undertow.rollout.engines import vllm_async as _vllm_async  # noqa: F401  (registers "vllm_async", lazily too)

__all__ = ["Engine", "Sample", "SamplingParams", "build_engine", "engines"]
