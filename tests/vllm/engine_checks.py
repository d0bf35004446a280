"""Shared by the vLLM engine's tests: the tolerance against the trainer and small helpers."""

from __future__ import annotations

from undertow.kernel.models import ModelSpec

TOLERANCE = 1e-4  # fp32 both sides; measured ~5e-6 (README)


def fields(spec: ModelSpec) -> dict:
    return spec.model_dump(include={"source", "path", "init_from"}, mode="json")


def prompts_of(engine, *texts: str) -> list[list[int]]:
    return [engine.tokenizer(t)["input_ids"] for t in texts]


def worst_gap(groups, prompts, expected_of) -> float:
    rows = [(p, s) for p, g in zip(prompts, groups) for s in g]
    expected = expected_of([(p, s.tokens) for p, s in rows])
    return max(abs(a - b) for (_, s), lp in zip(rows, expected) for a, b in zip(s.logprobs, lp))
