"""`prioritize`: a priority per experience, and per-task pass rates for the feeder's curriculum.

priority = floor + advantage_weight * |A| + freshness_weight * freshness + difficulty_weight * difficulty
  |A|        mean absolute advantage over response tokens (0 when not computed)
  freshness  1 / (1 + newest policy version seen - this experience's version)
  difficulty 1 - pass rate of the task so far (this group included)
`formula` replaces the weighted sum with a user function `fn(abs_advantage, freshness, difficulty) -> float`
(a dotted path). A success is a reward >= `success_threshold`.
"""

from __future__ import annotations

import importlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from undertow.schemas import Experience, TaskStat
from undertow.processors.deadline import built_in
from undertow.processors.api import processor
from undertow.processors.state import StageContext


@dataclass(slots=True)
class _Tally:
    """Attempts and successes of one task; a TaskStat record is built only when it is published."""

    taskset: str
    attempts: int = 0
    successes: int = 0
    updated_at: float = 0.0

    @property
    def pass_rate(self) -> float:
        return self.successes / self.attempts if self.attempts else 0.0


@processor("prioritize")
class Prioritize:
    def __init__(self, *, advantage_weight: float = 1.0, freshness_weight: float = 0.0,
                 difficulty_weight: float = 0.0, floor: float = 0.01, formula: str | None = None,
                 success_threshold: float = 1.0, stats_by: str | None = None, max_tasks: int = 100_000):
        self.weights = (advantage_weight, freshness_weight, difficulty_weight)
        self.floor, self.success_threshold = floor, success_threshold
        self.formula = _import(formula) if formula else None
        self.bounded = built_in(self.formula) if self.formula else True  # no user code: no stage deadline
        self.stats_by, self.max_tasks = stats_by, max_tasks
        self.newest_version = 0
        self._tasks: OrderedDict[str, _Tally] = OrderedDict()  # least recently updated first
        self._changed: set[str] = set()
        self.clock = StageContext().clock

    def bind(self, context: StageContext) -> None:
        self.clock = context.clock

    def process_group(self, group: list[Experience]) -> list[Experience]:
        self.newest_version = max([self.newest_version, *(e.policy_version for e in group)])
        now = self.clock()
        tallies = [self._count(e, now) for e in group]  # read after the whole group counted
        return [e.model_copy(update={"priority": self._priority(e, t)}) for e, t in zip(group, tallies)]

    def task_stats(self) -> list[TaskStat]:
        """TaskStat records changed since the last call (the runner publishes them)."""
        out = [TaskStat(task_id=t, taskset=self._tasks[t].taskset, attempts=self._tasks[t].attempts,
                        successes=self._tasks[t].successes, updated_at=self._tasks[t].updated_at)
               for t in sorted(self._changed) if t in self._tasks]
        self._changed.clear()
        return out

    def _count(self, exp: Experience, now: float) -> _Tally:
        key = str(exp.metadata.get(self.stats_by, exp.task_id)) if self.stats_by else exp.task_id
        tally = self._tasks.pop(key, None) or _Tally(str(exp.metadata.get("taskset", "default")) or "default")
        tally.attempts += 1
        tally.successes += int(exp.reward is not None and exp.reward >= self.success_threshold)
        tally.updated_at = now
        self._tasks[key] = tally
        self._changed.add(key)
        while len(self._tasks) > self.max_tasks:  # bounded: forget the least recently seen task
            self._changed.discard(self._tasks.popitem(last=False)[0])
        return tally

    def _priority(self, exp: Experience, tally: _Tally) -> float:
        # plain Python: numpy's per-call overhead exceeds the work for a few hundred tokens
        abs_adv = sum(map(abs, exp.advantages)) / len(exp.advantages) if exp.advantages else 0.0
        freshness = 1.0 / (1 + self.newest_version - exp.policy_version)
        difficulty = 1.0 - tally.pass_rate
        if self.formula is not None:
            return max(0.0, float(self.formula(abs_adv, freshness, difficulty)))
        wa, wf, wd = self.weights
        return self.floor + wa * abs_adv + wf * freshness + wd * difficulty


def _import(path: str) -> Callable[[float, float, float], float]:
    module, _, attr = path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise ValueError(f"prioritize.formula {path!r}: cannot import it ({e})") from None
