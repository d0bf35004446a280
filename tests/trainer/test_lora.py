"""LoRA through the real broker: only adapters train, the trainer publishes adapter-only updates,
a rollout engine applies them over its base, the checkpoint exports a merged model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from undertow.kernel.models import build_model
from undertow.kernel.models.adapters import is_adapter
from undertow.rollout.engines.transformers_engine import TransformersEngine
from undertow.schemas import MetricEvent, WeightUpdate, assemble_weights
from undertow.streams import Topics

from .helpers import SPEC, finish, make_group, produce, read_all, start_trainer, write_config

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_lora_trains_adapters_only_and_workers_apply_them(kafka, namespace, tmp_path: Path):
    topics = Topics(namespace)
    groups = [e for g in range(6) for e in make_group(f"task-{g}")]
    produce(kafka, topics.ready, groups)
    config = write_config(tmp_path, namespace, {
        "engine": {"lr": 0.01}, "batching": {"experiences": 8}, "checkpoint_every": 3,
        "lora": {"rank": 4, "alpha": 8}, "algorithm": {"kl": {"coef": 0.1}}})
    finish(start_trainer(config, "--max-steps", "3"), 240)

    metrics = [m.values for m in read_all(kafka, topics.metrics, expect=MetricEvent) if m.component == "trainer"]
    # The KL reference is the base with adapters off: identical at the start (B = 0), then apart.
    assert metrics[0]["kl"] == pytest.approx(0.0, abs=1e-7) and metrics[-1]["kl"] > 1e-6

    updates = [u for u in read_all(kafka, topics.weights, expect=WeightUpdate) if u.version == 3]
    assert updates and {u.payload for u in updates} == {"adapter"}
    blob = assemble_weights(updates)
    assert is_adapter(blob) and len(blob) < 20_000  # the adapter alone; the tiny model is ~500 kB

    # The merged export changed only the adapted modules (c_attn); everything else is the base.
    from transformers import AutoModelForCausalLM

    hf = tmp_path / "ckpt" / namespace / "step-00000003" / "hf"
    merged = AutoModelForCausalLM.from_pretrained(hf).state_dict()
    base = build_model(SPEC).state_dict()
    changed = {k for k in base if not torch.equal(base[k], merged[k])}
    assert changed and all("c_attn" in k for k in changed)
    assert (hf.parent / "hf-adapter" / "adapter_config.json").exists()

    # A worker's engine applies the adapter over its base and then scores what the merged model does.
    engine = TransformersEngine(SPEC, batch_size=4)
    good, bad = groups[0], groups[1]
    margin = lambda: sum(engine.logprobs(good.prompt_tokens, good.response_tokens, 1.0)) - \
        sum(engine.logprobs(bad.prompt_tokens, bad.response_tokens, 1.0))
    before = margin()
    engine.load_weights(blob)
    after = margin()
    ids = torch.tensor([good.prompt_tokens + good.response_tokens])
    with torch.no_grad():
        expected = AutoModelForCausalLM.from_pretrained(hf)(input_ids=ids).logits
        got = engine.model(input_ids=ids).logits
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert after > before + 0.1  # the good answer (advantage +1) gained on the bad one (−1)
