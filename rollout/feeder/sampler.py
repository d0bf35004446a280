"""Which task comes next: tasksets mixed by ratio, epochs, shuffling, difficulty-based selection.

Pure logic (no Kafka). Task ids are `<taskset>/<item key>@<draw>`: unique per fed task (the draw
counter of the taskset), while `item_key(task_id)` recovers the item, so pass rates reported per
task id on the task-stats topic add up per item across epochs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from schemas import Task, TaskStat

from rollout.feeder.items import TaskItem


def item_key(task_id: str) -> str:
    """`arith/17@203` -> `arith/17`: the item a fed task was drawn from."""
    return task_id.rsplit("@", 1)[0]


def difficulty_weight(pass_rate: float, floor: float) -> float:
    """Selection weight of an item: 1 at pass rate 1/2, `floor` for always / never solved.

    4p(1-p) is the variance of a Bernoulli(p) reward scaled to 1 at p = 1/2: groups whose samples all
    succeed or all fail carry no group-relative advantage (GRPO), so they teach nothing.
    """
    return floor + (1.0 - floor) * 4.0 * pass_rate * (1.0 - pass_rate)


@dataclass
class Difficulty:
    """Difficulty-based selection settings (see FeederConfig.difficulty)."""

    enabled: bool = False
    min_attempts: int = 4
    floor: float = 0.05


@dataclass
class Taskset:
    """One mixed taskset and where the feeder is in it."""

    name: str
    items: list[TaskItem]
    ratio: float
    group_size: int
    draws: int = 0
    order: list[int] = field(default_factory=list)


class TaskSampler:
    """Yields Tasks: each taskset gets `ratio` of the draws; each is read `epochs` times (None: forever).

    Mixing is deterministic: the next draw goes to the taskset furthest below its share, so after n
    draws every taskset holds its share to within one task. A taskset that has finished its epochs
    leaves the mix; `next()` returns None once all have.
    """

    def __init__(self, tasksets: list[Taskset], *, seed: int = 0, epochs: int | None = 1, shuffle: bool = True,
                 difficulty: Difficulty | None = None):
        total = sum(t.ratio for t in tasksets)
        self.tasksets = tasksets
        self.shares = {t.name: t.ratio / total for t in tasksets}
        self.epochs, self.shuffle = epochs, shuffle
        self.difficulty = difficulty or Difficulty()
        self.rng = random.Random(seed)
        self.stats: dict[str, TaskStat] = {}  # latest stat per task id
        self.by_item: dict[str, tuple[int, int]] = {}  # item key -> (attempts, successes)
        self.drawn = 0

    def update(self, stat: TaskStat) -> None:
        """Take a pass-rate report from the task-stats topic (the latest per task id wins)."""
        key = item_key(stat.task_id)
        old = self.stats.get(stat.task_id)
        attempts, successes = self.by_item.get(key, (0, 0))
        if old is not None:
            attempts, successes = attempts - old.attempts, successes - old.successes
        self.stats[stat.task_id] = stat
        self.by_item[key] = (attempts + stat.attempts, successes + stat.successes)

    def pass_rate(self, taskset: str, item: TaskItem) -> float | None:
        attempts, successes = self.by_item.get(f"{taskset}/{item.key}", (0, 0))
        return successes / attempts if attempts >= self.difficulty.min_attempts else None

    def next(self) -> Task | None:
        live = [t for t in self.tasksets if self.epochs is None or t.draws < self.epochs * len(t.items)]
        if not live:
            return None
        # Furthest below its share after this draw (ties: config order).
        taskset = max(live, key=lambda t: self.shares[t.name] * (self.drawn + 1) - t.draws)
        item = taskset.items[self._pick(taskset)]
        task = Task(task_id=f"{taskset.name}/{item.key}@{taskset.draws}", prompt=item.prompt,
                    messages=item.messages, answer=item.answer, taskset=taskset.name,
                    group_size=taskset.group_size,
                    metadata={**item.metadata, "item": item.key, "epoch": taskset.draws // len(taskset.items)})
        taskset.draws += 1
        self.drawn += 1
        return task

    def _pick(self, taskset: Taskset) -> int:
        if self.difficulty.enabled:
            weights = [1.0 if (p := self.pass_rate(taskset.name, item)) is None
                       else difficulty_weight(p, self.difficulty.floor) for item in taskset.items]
            return self.rng.choices(range(len(taskset.items)), weights=weights)[0]
        position = taskset.draws % len(taskset.items)
        if position == 0:  # a new epoch: a fresh order
            taskset.order = list(range(len(taskset.items)))
            if self.shuffle:
                self.rng.shuffle(taskset.order)
        return taskset.order[position]
