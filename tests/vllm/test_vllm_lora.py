"""trainer.lora with the vLLM engine: adapter-only updates applied as vLLM LoRA over the base.

An engine of its own (LoRA layers are set up at start-up): the generations' log-probs are those the
trainer recomputes with the same adapter, a whole-weights update drops the adapter.
"""

from __future__ import annotations

import gc

import pytest
import torch

from undertow.kernel.models import ModelSpec, build_model, weights_to_bytes
from undertow.kernel.models.adapters import LoraShape, adapter_to_bytes, wrap_lora
from undertow.schemas.logprobs import sequence_logprobs
from undertow.rollout.engines import SamplingParams, build_engine

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def spec(llama_dir) -> ModelSpec:
    return ModelSpec(source="hf", path=str(llama_dir))


@pytest.fixture(scope="module", params=["vllm", "vllm_async"])
def engine(spec, request):
    """Both vLLM engines: `vllm_async` applies adapters through its pause-load-resume swap."""
    engine = build_engine({"name": request.param, "max_model_len": 128, "max_lora_rank": 8}, spec)
    yield engine
    if request.param == "vllm_async":
        engine.close()
        return
    del engine.llm
    gc.collect()


def trained_adapter(spec: ModelSpec, seed: int):
    """A peft model as the trainer holds one after some steps: B no longer 0, so the adapter matters."""
    policy = wrap_lora(build_model(spec), LoraShape(rank=4, alpha=8.0, targets=("q_proj", "v_proj", "down_proj")))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5, generator=generator)
    return policy


def gap(engine, model, prompt: list[int], temperature: float = 1.0) -> float:
    samples = engine.generate([prompt], 4, SamplingParams(temperature=temperature, max_new_tokens=12))[0]
    worst = 0.0
    for s in samples:
        ids = torch.tensor([prompt + s.tokens])
        with torch.no_grad():
            want = sequence_logprobs(model, ids, torch.ones_like(ids), temperature)[0, len(prompt) - 1:]
        worst = max(worst, (want - torch.tensor(s.logprobs)).abs().max().item())
    return worst


def test_adapters_apply_as_vllm_lora_and_whole_weights_drop_them(engine, spec):
    prompt = engine.tokenizer("What is 2+3?")["input_ids"]
    base = build_model(spec)
    for seed in (1, 2):  # two versions in a row: the second replaces the first
        policy = trained_adapter(spec, seed)
        engine.load_weights(adapter_to_bytes(policy))
        assert gap(engine, policy, prompt) <= TOLERANCE
        assert gap(engine, base, prompt) > 1e-2  # the adapter really changed the distribution
    engine.load_weights(weights_to_bytes(base))
    assert gap(engine, base, prompt) <= TOLERANCE


def test_an_adapter_above_the_engines_rank_is_refused(engine, spec):
    policy = wrap_lora(build_model(spec), LoraShape(rank=16, alpha=16.0, targets=("q_proj",)))
    with pytest.raises(ValueError, match="max_lora_rank 8"):
        engine.load_weights(adapter_to_bytes(policy))
