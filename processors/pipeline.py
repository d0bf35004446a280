"""The pure processor pipeline: stages in config order, group assembly before the first group stage.

Nothing here knows Kafka. `push` takes a batch of arrivals and returns what is ready, what was
dropped (with stage and reason) and any task statistics; `tick` closes timed-out groups. The
Faust runner and the no-broker harness both drive it the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Mapping

from undertow.schemas import Experience, Record, TaskStat
from undertow.processors.api import Reject, Result, Stage, build_stages
from undertow.processors.deadline import TIMEOUT, Deadline, StageTimeout
from undertow.processors.groups import Arrival, Closed, GroupBuffer
from undertow.processors.metrics import PipelineStats
from undertow.processors.state import StageContext

ASSEMBLE = "assemble"
# Records of one batch retried one by one after its call hung: past this many hangs, the rest are rejected
# untried, so a batch costs at most (HANGS_PER_BATCH + 1) deadlines and the worker's watchdog never fires
# on it (a watchdog restart would read the same batch and hang again, for good).
HANGS_PER_BATCH = 3


@dataclass
class Dropped:
    """A record some stage refused: it goes to the rejected topic with `stage` and `reason`."""

    arrival: Arrival
    stage: str
    reason: str
    detail: str = ""


@dataclass
class Output:
    ready: list[Arrival] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    task_stats: list[TaskStat] = field(default_factory=list)

    def extend(self, other: "Output") -> None:
        self.ready += other.ready
        self.dropped += other.dropped
        self.task_stats += other.task_stats


class Pipeline:
    """Runs stages in order. Stages before the first group stage see records one batch at a time;
    from the first group stage on, they see one assembled group at a time."""

    emits: ClassVar[type[Record]] = Experience  # what reaches experiences.ready: a processor returns Experiences

    def __init__(self, stages: list[Stage], *, context: StageContext | None = None, group_timeout_s: float = 60.0,
                 on_timeout: Literal["emit", "reject"] = "emit", max_open_groups: int = 100_000,
                 stage_timeout_s: float | None = None, max_hung_calls: int = 8):
        self.context = context or StageContext()
        self.deadline = Deadline(stage_timeout_s, max_hung=max_hung_calls)  # None: stages are called directly
        self.stages = stages
        split = next((i for i, s in enumerate(stages) if s.is_group_stage), len(stages))
        self.before, self.after = stages[:split], stages[split:]
        self.on_timeout = on_timeout
        self.stats = PipelineStats()
        self.groups = GroupBuffer(self.context.store("groups"), timeout_s=group_timeout_s,
                                  max_open=max_open_groups) if self.after else None
        for stage in stages:
            stage.bind(self.context)

    @classmethod
    def from_config(cls, entries: list[str | Mapping[str, Any]], **kw: Any) -> "Pipeline":
        return cls(build_stages(entries), **kw)

    def push(self, arrivals: list[Arrival]) -> Output:
        """Process a batch of new arrivals."""
        out = Output()
        survivors = self._run_records(self.before, arrivals, out)
        if self.groups is None:
            out.ready += survivors
            self._finish(out)
            return out
        else:
            now = self.context.clock()
            for d in out.dropped:
                self._closed(self.groups.mark_dropped(d.arrival.experience, now), out)
            for arrival in survivors:
                result = self.groups.add(arrival, now)
                if isinstance(result, str):
                    self._drop(out, arrival, ASSEMBLE, *_reason(result))
                else:
                    self._closed(result, out)
            self.stats.gauges["open_groups"] = float(len(self.groups))
        self._finish(out)
        return out

    def tick(self) -> Output:
        """Close groups that waited past the timeout (emit partial or reject, per `on_timeout`)."""
        out = Output()
        if self.groups is not None:
            for closed in self.groups.expired(self.context.clock()):
                self._closed(closed, out)
            self.stats.gauges["open_groups"] = float(len(self.groups))
        self._finish(out)
        return out

    def _closed(self, closed: Closed | None, out: Output) -> None:
        if closed is None:
            return
        if not closed.timed_out:
            self.stats.record(ASSEMBLE, len(closed.members), len(closed.members), 0.0)
        elif self.on_timeout == "reject" or not closed.members:
            detail = f"{len(closed.members)} of {closed.expected} samples arrived before the timeout"
            for arrival in closed.members:
                self._drop(out, arrival, ASSEMBLE, "group_timeout", detail)
            return
        else:
            self.stats.record(ASSEMBLE, len(closed.members), len(closed.members), 0.0)
            self.stats.gauges["partial_groups"] = self.stats.gauges.get("partial_groups", 0.0) + 1
        out.ready += self._run_group(closed.members, out)

    def _run_group(self, members: list[Arrival], out: Output) -> list[Arrival]:
        for stage in self.after:
            if not members:
                break
            if not stage.is_group_stage:
                members = self._run_records([stage], members, out)
                continue
            start = time.perf_counter()
            try:
                result = self._call(stage, stage.run_group, [a.experience for a in members])
            except StageTimeout as e:
                result = Reject(TIMEOUT, str(e))
            except Exception as e:  # a plugin's bug must not stop the stream
                result = Reject("error", f"{type(e).__name__}: {e}")
            if isinstance(result, Reject):
                for arrival in members:
                    self._drop(out, arrival, stage.name, result.reason, result.detail)
                self.stats.record(stage.name, len(members), 0, time.perf_counter() - start)
                return []
            self.stats.record(stage.name, len(members), len(result), time.perf_counter() - start)
            members = _keep_sources(members, result)
        return members

    def _run_records(self, stages: list[Stage], arrivals: list[Arrival], out: Output) -> list[Arrival]:
        for stage in stages:
            if not arrivals:
                break
            start = time.perf_counter()
            results = self._results(stage, arrivals)
            kept: list[Arrival] = []
            for arrival, result in zip(arrivals, results):
                if isinstance(result, Experience):
                    kept.append(_same_source(arrival, result))
                elif isinstance(result, list):
                    kept += [_same_source(arrival, r) for r in result]
                elif isinstance(result, Reject):
                    self._drop(out, arrival, stage.name, result.reason, result.detail)
                elif result is None:
                    self._drop(out, arrival, stage.name, "dropped", "the processor returned None")
                else:
                    self._drop(out, arrival, stage.name, "error", f"returned a {type(result).__name__}")
            self.stats.record(stage.name, len(arrivals), len(kept), time.perf_counter() - start)
            arrivals = kept
        return arrivals

    def _results(self, stage: Stage, arrivals: list[Arrival]) -> list[Result]:
        exps = [a.experience for a in arrivals]
        try:
            return self._call(stage, stage.run_batch, exps)
        except StageTimeout as e:
            if len(exps) == 1:
                return [Reject(TIMEOUT, str(e))]
        except Exception:
            pass  # find the record that raised (or hung): retry one by one
        results: list[Result] = []
        hangs = 0
        for exp in exps:
            if hangs >= HANGS_PER_BATCH:
                results.append(Reject(TIMEOUT, f"not tried: {hangs} earlier records of its batch hung {stage.name!r}"))
                continue
            try:
                results += self._call(stage, stage.run_batch, [exp])
            except StageTimeout as e:
                hangs += 1
                results.append(Reject(TIMEOUT, str(e)))
            except Exception as e:
                results.append(Reject("error", f"{type(e).__name__}: {e}"))
        return results

    def _call(self, stage: Stage, method: Callable[[list[Experience]], Any], exps: list[Experience]) -> Any:
        """A stage's call under the deadline, unless the stage runs only undertow's code or keeps a deadline
        of its own (`bounded`): a thread hop per group cost up to a third of a plain pipeline's throughput."""
        if getattr(stage.impl, "bounded", False):
            return method(exps)
        try:
            return self.deadline.call(f"processor {stage.name!r}", method, exps)
        except StageTimeout as e:
            where = getattr(stage.impl, "now_running", None)  # e.g. the data-juicer op that hung
            raise StageTimeout(f"{e} (in {where})" if where else str(e)) from None

    def wedged(self) -> str | None:
        """Why the process should restart: too many hung calls still hold threads (else None)."""
        return self.deadline.wedged()

    def _drop(self, out: Output, arrival: Arrival, stage: str, reason: str, detail: str = "") -> None:
        self.stats.drop(stage, reason)
        out.dropped.append(Dropped(arrival, stage, reason, detail))

    def _finish(self, out: Output) -> None:
        """Stamp what is ready with the "processed" time, collect task statistics, and write the
        state this batch changed (once per batch: each write may be a changelog record)."""
        now = self.context.clock()
        for arrival in out.ready:
            arrival.experience.timestamps = {**arrival.experience.timestamps, "processed": now}
        for stage in self.stages:
            out.task_stats += stage.task_stats()
            stage.flush()
        if self.groups is not None:
            self.groups.flush()


def _reason(message: str) -> tuple[str, str]:
    if message == "duplicate_sample":
        return message, "this sample index already arrived"
    if message == "late_sample":
        return message, "its group was already closed (complete, or timed out)"
    return "group_mismatch", message


def _same_source(arrival: Arrival, exp: Experience) -> Arrival:
    return arrival if exp is arrival.experience else Arrival(exp, arrival.partition, arrival.offset)


def _keep_sources(members: list[Arrival], exps: list[Experience]) -> list[Arrival]:
    by_id = {a.experience.experience_id: a for a in members}
    return [_same_source(by_id[e.experience_id], e) if e.experience_id in by_id else Arrival(e) for e in exps]
