"""Per-stage counters: records in, out, dropped by reason, and time spent; flattened for MetricEvent."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class StageStats:
    records_in: int = 0
    records_out: int = 0
    dropped: Counter = field(default_factory=Counter)  # reason -> count
    seconds: float = 0.0
    calls: int = 0


class PipelineStats:
    """Counters since start, per stage name (plus the "assemble" step of group assembly)."""

    def __init__(self) -> None:
        self.stages: dict[str, StageStats] = {}
        self.gauges: dict[str, float] = {}

    def stage(self, name: str) -> StageStats:
        return self.stages.setdefault(name, StageStats())

    def record(self, name: str, n_in: int, n_out: int, seconds: float) -> None:
        s = self.stage(name)
        s.records_in += n_in
        s.records_out += n_out
        s.seconds += seconds
        s.calls += 1

    def drop(self, name: str, reason: str, n: int = 1) -> None:
        self.stage(name).dropped[reason] += n

    def values(self) -> dict[str, float]:
        """Flat names for a MetricEvent: `<stage>.in`, `.out`, `.dropped.<reason>`, `.latency_ms`.
        Safe while a batch runs on the job thread: each dict is copied whole (one step under the GIL)."""
        out: dict[str, float] = dict(self.gauges)
        for name, s in list(self.stages.items()):
            out[f"{name}.in"] = float(s.records_in)
            out[f"{name}.out"] = float(s.records_out)
            out[f"{name}.dropped"] = float(sum(s.dropped.values()))
            for reason, n in list(s.dropped.items()):
                out[f"{name}.dropped.{reason}"] = float(n)
            # Mean time per record through this stage, so batched and single calls compare.
            out[f"{name}.latency_ms"] = 1000.0 * s.seconds / max(s.records_in, 1)
        return out
