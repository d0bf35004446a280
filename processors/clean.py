"""`clean`: drop what must not reach training: empty, truncated, out-of-bounds, non-finite, duplicate."""

from __future__ import annotations

import math
from typing import Literal

from undertow.schemas import Experience
from undertow.processors.api import Reject, processor
from undertow.processors.state import DedupeWindow, StageContext, content_hash


@processor("clean")
class Clean:
    """Each check is a keyword argument; a failed check rejects the record with a named reason.

    dedupe="sample" catches redelivered samples (same experience id and response); "response" also
    drops a response identical to an earlier one for the same task (diversity); None turns it off.
    """

    bounded = True  # undertow's own quick checks: called without the stage deadline (pipeline.py)

    def __init__(self, *, empty: Literal["drop", "keep"] = "drop", truncated: Literal["drop", "keep"] = "keep",
                 min_response_tokens: int = 0, max_response_tokens: int | None = None,
                 max_prompt_tokens: int | None = None, dedupe: Literal["sample", "response"] | None = "sample",
                 dedupe_window_s: float = 3600.0, dedupe_max_entries: int = 200_000):
        if max_response_tokens is not None and min_response_tokens > max_response_tokens:
            raise ValueError(f"min_response_tokens {min_response_tokens} > max_response_tokens "
                             f"{max_response_tokens}: every record would be dropped")
        self.empty, self.truncated = empty, truncated
        self.min_tokens, self.max_tokens, self.max_prompt = min_response_tokens, max_response_tokens, max_prompt_tokens
        self.dedupe, self.window_s, self.max_entries = dedupe, dedupe_window_s, dedupe_max_entries
        self.window: DedupeWindow | None = None
        self.clock = StageContext().clock

    def bind(self, context: StageContext) -> None:
        self.clock = context.clock
        if self.dedupe is not None:
            self.window = DedupeWindow(context.store("dedupe"), window_s=self.window_s, max_entries=self.max_entries)

    def flush(self) -> None:
        if self.window is not None:
            self.window.flush()

    def process(self, exp: Experience) -> Experience | Reject:
        n = len(exp.response_tokens)
        if self.empty == "drop" and _empty(exp):
            return Reject("empty", f"{n} response tokens, text {exp.response_text[:40]!r}")
        if self.truncated == "drop" and exp.finish_reason in ("length", "abort"):
            return Reject("truncated", f"finish_reason {exp.finish_reason!r} after {n} tokens")
        if n < self.min_tokens:
            return Reject("too_short", f"{n} response tokens < min_response_tokens {self.min_tokens}")
        if self.max_tokens is not None and n > self.max_tokens:
            return Reject("too_long", f"{n} response tokens > max_response_tokens {self.max_tokens}")
        if self.max_prompt is not None and len(exp.prompt_tokens) > self.max_prompt:
            return Reject("too_long", f"{len(exp.prompt_tokens)} prompt tokens > max_prompt_tokens {self.max_prompt}")
        bad = _non_finite(exp)
        if bad:
            return Reject("non_finite", f"{bad} is not a finite number")
        if self.window is not None and self.window.seen(self._key(exp), exp.group_id.encode(), self.clock()):
            return Reject("duplicate", f"same {self.dedupe} content seen within {self.window_s:g} s")
        return exp

    def _key(self, exp: Experience) -> bytes:
        if self.dedupe == "sample":
            return content_hash("sample", exp.experience_id, exp.response_text)
        return content_hash("response", exp.task_id, exp.response_text)


def _empty(exp: Experience) -> bool:
    """No tokens, or text that is only whitespace (text "" with tokens means the text was not recorded)."""
    return not exp.response_tokens or (exp.response_text != "" and not exp.response_text.strip())


def _non_finite(exp: Experience) -> str | None:
    """The first field holding NaN or infinity (pipeline stages may set values without validation)."""
    if exp.reward is not None and not math.isfinite(exp.reward):
        return f"reward {exp.reward}"
    for name, value in exp.reward_components.items():
        if not math.isfinite(value):
            return f"reward_components.{name} {value}"
    if not all_finite(exp.behaviour_logprobs):
        return "a behaviour log-prob"
    if not all_finite(exp.advantages):
        return "an advantage"
    return None


def all_finite(values: list[float]) -> bool:
    """NaN and infinities propagate into a sum, so a finite sum (one C loop) proves every value
    finite; only a non-finite sum, which finite values can also reach by overflow, needs the scan."""
    return math.isfinite(sum(values)) or all(map(math.isfinite, values))
