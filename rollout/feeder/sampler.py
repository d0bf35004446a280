"""Which task comes next: tasksets mixed by ratio, epochs, and a selector per taskset (selectors.py).

Pure logic (no Kafka). Task ids are `<taskset>/<item key>@<draw>`: unique per fed task (the draw
counter of the taskset), while `item_key(task_id)` recovers the item, so pass rates reported per
task id on the task-stats topic add up per item across epochs. The draw index in the id is also how
a restarted feeder finds where it was (`published_draws`, `skip`): from its own records, whatever
else is on the topic.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from undertow.schemas import Task, TaskStat

from undertow.rollout.feeder.items import TaskItem
from undertow.rollout.feeder.selectors import Selector, Shuffle, selectors


def item_key(task_id: str) -> str:
    """`arith/17@203` -> `arith/17`: the item a fed task was drawn from."""
    return task_id.rsplit("@", 1)[0]


def draw_index(task_id: str) -> int | None:
    """`arith/17@203` -> 203: the taskset's draw that made the task; None for an id of another form."""
    _, at, draw = task_id.rpartition("@")
    return int(draw) if at and draw.isdigit() else None


@dataclass
class Taskset:
    """One mixed taskset and where the feeder is in it."""

    name: str
    items: list[TaskItem]
    ratio: float
    group_size: int
    draws: int = 0
    selector: Selector = field(default_factory=Shuffle)
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

    def __init__(self, tasksets: list[Taskset], *, seed: int = 0, epochs: int | None = 1,
                 selector: str | Mapping[str, Any] = "shuffle"):
        total = sum(t.ratio for t in tasksets)
        self.tasksets = tasksets
        self.shares = {t.name: t.ratio / total for t in tasksets}
        self.epochs = epochs
        make = selectors.resolve(selector)
        for t in tasksets:  # one each: a selector keeps its taskset's epoch order
            t.selector = make()
        self.uses_pass_rates = any(t.selector.uses_pass_rates for t in tasksets)
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

    def pass_rates(self) -> dict[str, float]:
        """Per taskset with reports: successes over attempts, every item's tasks together."""
        totals: dict[str, list[int]] = {}
        for key, (attempts, successes) in self.by_item.items():
            total = totals.setdefault(key.split("/", 1)[0], [0, 0])
            total[0], total[1] = total[0] + attempts, total[1] + successes
        return {name: s / a for name, (a, s) in totals.items() if a}

    def counts(self, taskset: str, item: TaskItem) -> tuple[int, int]:
        """(attempts, successes) of an item over every task drawn from it."""
        return self.by_item.get(f"{taskset}/{item.key}", (0, 0))

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
        return taskset.selector.pick(taskset.items, taskset.draws, lambda item: self.counts(taskset.name, item),
                                     self.rng)

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

        A selector that does not use pass rates has its draws replayed, so shuffled orders continue
        exactly: the feeder publishes in draw order, so what it published is a prefix of the sequence
        and the replay stops right after it. One steered by pass rates drew at random: only the
        counters move on (ids stay new, epochs stay counted).
        """
        before = self.drawn
        if self.uses_pass_rates:
            for t in self.tasksets:
                t.draws = max(t.draws, drawn.get(t.name, 0))
            self.drawn = sum(t.draws for t in self.tasksets)
            return self.drawn - before
        while any(t.draws < drawn.get(t.name, 0) for t in self.tasksets):
            if self.next() is None:
                break
        return self.drawn - before
