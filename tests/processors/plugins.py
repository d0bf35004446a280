"""User-style plugins, named by dotted path in configs (tests.processors.plugins.…)."""

from __future__ import annotations

import time

from undertow.processors import Reject, processor
from undertow.schemas import Experience


@processor("test_shout")
def shout(exp: Experience, *, suffix: str = "!") -> Experience:
    """Rewrites the response: shows a plugin changing the stream."""
    return exp.model_copy(update={"response_text": exp.response_text.upper() + suffix})


def drop_containing(exp: Experience, *, word: str) -> Experience | Reject | None:
    if word in exp.response_text:
        return Reject("forbidden_word", f"contains {word!r}")
    return exp


def explode_on(exp: Experience, *, text: str = "boom") -> Experience:
    if exp.response_text == text:
        raise ValueError("cannot handle this one")
    return exp


def vanish(exp: Experience) -> None:
    return None


def dawdle(exp: Experience, *, seconds: float = 0.02) -> Experience:
    """Takes its time: what a stage's latency_ms must show."""
    time.sleep(seconds)
    return exp


class KeepBest:
    """A group plugin: keeps the best `k` samples of each group."""

    def __init__(self, *, k: int = 1):
        self.k = k

    def process_group(self, group: list[Experience]) -> list[Experience]:
        return sorted(group, key=lambda e: -(e.reward or 0.0))[: self.k]


def length_scorer(exps: list[Experience]) -> list[dict[str, float]]:
    """A model-based scorer stand-in for the hook's contract: one call per batch."""
    length_scorer.calls.append(len(exps))
    return [{"judge": len(e.response_text) / 10} for e in exps]


length_scorer.calls = []
