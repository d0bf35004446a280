"""`score`: scores computed in the stream, and a hook for a model-based scorer called in batches.

A stream score is `fn(exp: Experience, **kwargs) -> dict[str, float]` (named reward components):
it sees the whole experience, where a rollout reward (rollout/rewards/) sees a response and its task,
so the two have registries and names of their own (none is shared). A scorer is a callable (or a
class built with its kwargs, then called) taking a list of experiences and returning, per experience,
a dict of components or a Reject (the record goes to the rejected topic with its reason); one that
has a `scored_by` attribute (`name@version`) gets it added to each scored experience's
`metadata.scored_by` (a list: one entry per scoring stage). The model scorers (`reward_model`,
`llm_judge`) are in processors/scorers.py.
Components are merged into `reward_components`; an unscored experience gets their sum as its reward,
a scored one gets them added when `add_to_reward` is set (replacing it when `overwrite` is).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from undertow.kernel.registry import Registry
from undertow.schemas import Experience
from undertow.processors.deadline import built_in
from undertow.processors.api import Reject, processor

STREAM_SCORES: Registry[Callable[..., dict[str, float]]] = Registry("stream score")
SCORERS: Registry[Any] = Registry("scorer")

Entry = str | Mapping[str, Any]


def stream_score(name: str) -> Callable[[Any], Any]:
    """Decorator registering a stream score under a short name."""
    return STREAM_SCORES.register(name)


@stream_score("format_bonus")
def format_bonus(exp: Experience, *, pattern: str = r"\\boxed\{[^}]*\}", weight: float = 0.1) -> dict[str, float]:
    """`weight` when the response matches `pattern` (a regular expression), else 0."""
    return {"format_bonus": weight if re.search(pattern, exp.response_text) else 0.0}


@stream_score("length_bonus")
def length_bonus(exp: Experience, *, target_tokens: int = 256, weight: float = 0.1) -> dict[str, float]:
    """-weight * |n - target| / target: prefers responses near a target length."""
    n = len(exp.response_tokens)
    return {"length_bonus": -weight * abs(n - target_tokens) / target_tokens}


@stream_score("metadata_answer")
def metadata_answer(exp: Experience, *, field: str = "answer") -> dict[str, float]:
    """1 when the stripped response equals `metadata[field]` (the reference answer rollout attached)."""
    answer = exp.metadata.get(field)
    return {"correct": float(answer is not None and exp.response_text.strip() == str(answer).strip())}


@processor("score")
class Score:
    """Applies the stream `scores` to each record and `scorer` to batches of `batch_size`."""

    def __init__(self, *, scores: list[Entry] = (), scorer: Entry | None = None, batch_size: int = 32,
                 add_to_reward: bool = True, overwrite: bool = False):
        self.scores = [STREAM_SCORES.resolve(e).bind() for e in scores]
        self.scorer = SCORERS.resolve(scorer).bind() if scorer is not None else None
        self.batch_size, self.add_to_reward, self.overwrite = batch_size, add_to_reward, overwrite
        self.runs_off_loop = self.scorer is not None  # a model's batch takes seconds (streams/faust/worker.py)
        # Called without the stage deadline (pipeline.py) when it runs only undertow's code, or when a model
        # scorer keeps its own (kernel/scoring/base.py: a model's batch may rightly take longer).
        self.bounded = self.scorer is not None or built_in(*self.scores)

    def process_batch(self, exps: list[Experience]) -> list[Experience | Reject]:
        components = [self._rewards(exp) for exp in exps]
        verdicts: list[Reject | None] = [None] * len(exps)
        if self.scorer is not None:
            for start in range(0, len(exps), self.batch_size):
                chunk = exps[start:start + self.batch_size]
                scored = list(self.scorer(chunk))
                if len(scored) != len(chunk):
                    raise RuntimeError(f"scorer returned {len(scored)} results for {len(chunk)} experiences")
                for i, extra in enumerate(scored):
                    if isinstance(extra, Reject):
                        verdicts[start + i] = extra
                    else:
                        components[start + i].update(extra)
        return [v or self._apply(exp, c) for exp, c, v in zip(exps, components, verdicts)]

    def _rewards(self, exp: Experience) -> dict[str, float]:
        out: dict[str, float] = {}
        for fn in self.scores:
            out.update(fn(exp))
        return out

    def _apply(self, exp: Experience, components: dict[str, float]) -> Experience:
        if not components:
            return exp
        total = float(sum(components.values()))
        if exp.reward is None or self.overwrite:
            reward_value = total
        else:
            reward_value = exp.reward + total if self.add_to_reward else exp.reward
        merged = {**exp.reward_components, **{k: float(v) for k, v in components.items()}}
        update = {"reward": reward_value, "reward_components": merged}
        scored_by = getattr(self.scorer, "scored_by", None)
        if scored_by is not None:  # a list: each scoring stage adds its own
            before = exp.metadata.get("scored_by")
            by = [*(before if isinstance(before, list) else [before] if before else []), scored_by]
            update["metadata"] = {**exp.metadata, "scored_by": list(dict.fromkeys(by))}
        return exp.model_copy(update=update)
