"""The engine interface every backend implements, and the records it returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Mapping, Protocol

from pydantic import BaseModel, ConfigDict, Field

from undertow.kernel.models import ModelSpec
from undertow.kernel.registry import Registry


class SamplingParams(BaseModel):
    """How to sample a response."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, gt=0, description="softmax temperature; behaviour log-probs use the same one")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling mass (1 = off)")
    max_new_tokens: int = Field(32, ge=1, description="longest response per generation, in tokens")
    greedy: bool = Field(False, description="the most likely token each step instead of a sample (evaluation); "
                                            "log-probs are still those of softmax(logits / temperature)")
    logprobs: bool = Field(True, description="record each token's behaviour log-prob (what training needs); "
                                             "evaluation asks for none and the engine skips computing them")


@dataclass
class Sample:
    """One generated continuation of one prompt.

    `logprobs[i]` (empty when the sampling asked for none) is log p(tokens[i]) under softmax(logits / temperature) of the full vocabulary, as
    `schemas.logprobs` defines it (top-p shapes what is sampled, not this number), so the trainer
    recomputes the same value from the same weights. `versions[i]` is the policy version of the
    weights that sampled tokens[i] (the engine's `version` then); empty from an engine that does not
    say, meaning every token is of the version the caller loaded last.
    """

    tokens: list[int]
    text: str
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    versions: list[int] = field(default_factory=list)


class Engine(Protocol):
    """What a workflow needs from a backend, and what the config rules ask of its class: the
    environment it runs in (`main`, or `vllm`: the interpreter `undertow run` starts its workers
    with), the sampling it can record log-probs for, and whether it can apply adapter-only updates.
    Optional capabilities, asked with getattr: `continuous_batching = True` (generate() may be called
    from many threads at once, sharing one running batch: the worker's continuous loop) and
    `at_version(v)` (the engine whose loads name version v, switched while generation is paused)."""

    tokenizer: Any
    environment: ClassVar[str]

    @classmethod
    def check_sampling(cls, params: SamplingParams) -> None:
        """Raise ValueError for sampling whose recorded log-probs would differ from the trainer's."""

    @classmethod
    def adapter_problem(cls, options: Mapping[str, Any], rank: int) -> str | None:
        """Why an engine built with `options` cannot apply rank-`rank` LoRA adapter updates, or None."""

    def generate(self, prompts: list[list[int]], n: int, params: SamplingParams) -> list[list[Sample]]:
        """`n` samples for each prompt (token ids); result[i][j] is sample j of prompt i."""

    def logprobs(self, prompt: list[int], continuation: list[int], temperature: float) -> list[float]:
        """Log-prob of each continuation token given everything before it."""

    def load_weights(self, blob: bytes) -> None:
        """Replace the weights in place with safetensors bytes (a WeightUpdate payload)."""

    def load_weight_files(self, paths: list[Path]) -> None:
        """Replace the whole weights in place from safetensors bucket files, one tensor at a time,
        refusing (ValueError, weights untouched) a set of tensors that is not the model's."""


engines: Registry[type] = Registry("engine")


def build_engine(entry: str | Mapping[str, Any], spec: ModelSpec) -> Engine:
    """An engine from a config entry (`transformers` or `{name: transformers, batch_size: 8}`)."""
    return engines.resolve(entry)(spec)
