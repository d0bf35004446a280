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
from typing import Callable

import numpy as np

from schemas import Experience, TaskStat
from processors.api import processor
from processors.state import StageContext


@processor("prioritize")
class Prioritize:
    def __init__(self, *, advantage_weight: float = 1.0, freshness_weight: float = 0.0,
                 difficulty_weight: float = 0.0, floor: float = 0.01, formula: str | None = None,
                 success_threshold: float = 1.0, stats_by: str | None = None, max_tasks: int = 100_000):
        self.weights = (advantage_weight, freshness_weight, difficulty_weight)
        self.floor, self.success_threshold = floor, success_threshold
        self.formula = _import(formula) if formula else None
        self.stats_by, self.max_tasks = stats_by, max_tasks
        self.newest_version = 0
        self._tasks: OrderedDict[str, TaskStat] = OrderedDict()  # least recently updated first
        self._changed: set[str] = set()
        self.clock = StageContext().clock

    def bind(self, context: StageContext) -> None:
        self.clock = context.clock

    def process_group(self, group: list[Experience]) -> list[Experience]:
        self.newest_version = max([self.newest_version, *(e.policy_version for e in group)])
        keys = [self._count(e) for e in group]
        stats = [self._tasks.get(k) or TaskStat(task_id=k) for k in keys]  # after the whole group counted
        return [e.model_copy(update={"priority": self._priority(e, s)}) for e, s in zip(group, stats)]

    def task_stats(self) -> list[TaskStat]:
        """TaskStat records changed since the last call (the runner publishes them)."""
        out = [self._tasks[t] for t in sorted(self._changed) if t in self._tasks]
        self._changed.clear()
        return out

    def _count(self, exp: Experience) -> str:
        key = str(exp.metadata.get(self.stats_by, exp.task_id)) if self.stats_by else exp.task_id
        old = self._tasks.pop(key, None)
        success = int(exp.reward is not None and exp.reward >= self.success_threshold)
        stat = TaskStat(task_id=key, taskset=str(exp.metadata.get("taskset", "default")) or "default",
                        attempts=(old.attempts if old else 0) + 1, successes=(old.successes if old else 0) + success,
                        updated_at=self.clock())
        self._tasks[key] = stat
        self._changed.add(key)
        while len(self._tasks) > self.max_tasks:  # bounded: forget the least recently seen task
            self._changed.discard(self._tasks.popitem(last=False)[0])
        return key

    def _priority(self, exp: Experience, stat: TaskStat) -> float:
        abs_adv = float(np.abs(np.asarray(exp.advantages, dtype=np.float64)).mean()) if exp.advantages else 0.0
        freshness = 1.0 / (1 + self.newest_version - exp.policy_version)
        difficulty = 1.0 - stat.pass_rate
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
