"""Held-out evaluation results (eval -> anyone): one record per policy version and taskset."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from .base import Finite, Id, Record, UnixTime

Fraction = Annotated[float, Field(ge=0, le=1)]


class EvalResult(Record):
    """How policy `version` did on held-out taskset `taskset`.

    `greedy_accuracy`: the fraction of tasks whose greedy answer scored at least the success
    threshold; `pass_at` maps "pass@k" to the unbiased estimate (Chen et al. 2021, eq. 1) from
    `samples` sampled answers per task; rewards and lengths are means over the sampled answers
    (over the greedy ones when there are no samples).
    """

    kind: ClassVar[str] = "eval"
    id_field: ClassVar[str | None] = None

    model: Id
    version: Annotated[int, Field(ge=0)]
    taskset: Id
    tasks: Annotated[int, Field(ge=1)]
    greedy_accuracy: Fraction | None = None
    samples: Annotated[int, Field(ge=0)] = 0
    pass_at: dict[str, Fraction] = {}  # "pass@1", "pass@4", …
    mean_reward: Finite
    mean_response_tokens: Annotated[float, Field(ge=0)]
    seconds: Annotated[float, Field(ge=0)]
    time: UnixTime
