"""Which task comes next: tasksets mixed by ratio, epochs, shuffling, difficulty-based selection.

Pure logic (no Kafka). Task ids are `<taskset>/<item key>@<draw>`: unique per fed task (the draw
counter of the taskset), while `item_key(task_id)` recovers the item, so pass rates reported per
task id on the task-stats topic add up per item across epochs. The draw index in the id is also how
a restarted feeder finds where it was (`published_draws`, `skip`): from its own records, whatever
else is on the topic.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Iterable

from undertow.schemas import Task, TaskStat

from undertow.rollout.feeder.items import TaskItem


def item_key(task_id: str) -> str:
    """`arith/17@203` -> `arith/17`: the item a fed task was drawn from."""
    return task_id.rsplit("@", 1)[0]


def draw_index(task_id: str) -> int | None:
    """`arith/17@203` -> 203: the taskset's draw that made the task; None for an id of another form."""
    _, at, draw = task_id.rpartition("@")
    return int(draw) if at and draw.isdigit() else None


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
    by_key: dict[str, TaskItem] = field(default_factory=dict, init=False, repr=False)

    def item(self, key: str) -> TaskItem | None:
        """The item with this key (indexed on first use)."""
        if not self.by_key:
            self.by_key = {item.key: item for item in self.items}
        return self.by_key.get(key)


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

    # -- a restarted feeder ------------------------------------------------------------------------

    def published_draws(self, tasks: Iterable[Task]) -> dict[str, int]:
        """Per taskset, the draws already published: one past the highest draw index among the
        tasks that are this sampler's (its taskset, one of its items, that item's prompt). Anything
        else (another producer's tasks, a replay into this topic, junk) is not counted."""
        drawn: dict[str, int] = {}
        for task in tasks:
            draw = draw_index(task.task_id)
            if draw is not None and self.made(task):
                drawn[task.taskset] = max(drawn.get(task.taskset, 0), draw + 1)
        return drawn

    def made(self, task: Task) -> bool:
        """Whether `task` is one this sampler draws: id, taskset and content agree with one of its items."""
        taskset = next((t for t in self.tasksets if t.name == task.taskset), None)
        prefix = f"{task.taskset}/"
        if taskset is None or not task.task_id.startswith(prefix):
            return False
        item = taskset.item(item_key(task.task_id)[len(prefix):])
        return item is not None and (item.prompt, item.messages) == (task.prompt, task.messages)

    def skip(self, drawn: dict[str, int]) -> int:
        """Move past `drawn` draws per taskset without yielding them; returns how many were skipped.

        Without difficulty selection the draws are replayed, so shuffled orders continue exactly:
        the feeder publishes in draw order, so what it published is a prefix of the sequence and
        the replay stops right after it. With difficulty selection the draws were random and
        steered by pass rates: only the counters move on (ids stay new, epochs stay counted).
        """
        before = self.drawn
        if self.difficulty.enabled:
            for t in self.tasksets:
                t.draws = max(t.draws, drawn.get(t.name, 0))
            self.drawn = sum(t.draws for t in self.tasksets)
            return self.drawn - before
        while any(t.draws < drawn.get(t.name, 0) for t in self.tasksets):
            if self.next() is None:
                break
        return self.drawn - before
