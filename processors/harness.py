"""The no-broker harness: drive a pipeline with a hand-set clock, as unit tests and notebooks do."""

from __future__ import annotations

from typing import Any, Literal, Mapping

from undertow.schemas import Experience
from undertow.processors.groups import Arrival
from undertow.processors.pipeline import Output, Pipeline
from undertow.processors.state import StageContext


class Harness:
    """Feed experiences, move the clock, and read back everything that came out so far."""

    def __init__(self, entries: list[str | Mapping[str, Any]], *, group_timeout_s: float = 60.0,
                 on_timeout: Literal["emit", "reject"] = "emit", max_open_groups: int = 100_000,
                 stage_timeout_s: float | None = None, max_hung_calls: int = 8):
        self.now = 1_700_000_000.0
        self.pipeline = Pipeline.from_config(entries, context=StageContext(clock=lambda: self.now),
                                             group_timeout_s=group_timeout_s, on_timeout=on_timeout,
                                             max_open_groups=max_open_groups, stage_timeout_s=stage_timeout_s,
                                             max_hung_calls=max_hung_calls)
        self.out = Output()

    def feed(self, exps: list[Experience], batch_size: int | None = None) -> Output:
        """Push experiences in batches (all at once by default); returns this call's output."""
        step, out = batch_size or max(len(exps), 1), Output()
        for start in range(0, len(exps), step):
            out.extend(self.pipeline.push([Arrival(e) for e in exps[start:start + step]]))
        self.out.extend(out)
        return out

    def advance(self, seconds: float) -> Output:
        """Move the clock and close what timed out."""
        self.now += seconds
        out = self.pipeline.tick()
        self.out.extend(out)
        return out

    @property
    def ready(self) -> list[Experience]:
        return [a.experience for a in self.out.ready]

    def reasons(self) -> list[tuple[str, str]]:
        """(stage, reason) of every drop so far, in order."""
        return [(d.stage, d.reason) for d in self.out.dropped]
