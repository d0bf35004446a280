"""The bounded window of complete groups, and how a batch is drawn from it. No Kafka here.

FIFO by default; with prioritization, groups are drawn without replacement with probability
proportional to their mean priority (Schaul et al. 2016, "Prioritized Experience Replay", eq. 1, α = 1).
A batch holds whole groups up to `experiences` records or `token_budget` tokens (at least one group).
"""

from __future__ import annotations

import random
from collections import deque
from typing import Callable, Sequence, TypeVar

from .groups import Group


class Window:
    """At most `capacity` complete groups waiting to be trained on."""

    def __init__(self, capacity: int, prioritized: bool = False, seed: int = 0):
        self.capacity, self.prioritized = capacity, prioritized
        self._groups: deque[Group] = deque()
        self._ids: set[str] = set()
        self._rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, record_id: str) -> bool:
        return record_id in self._ids

    @property
    def full(self) -> bool:
        return len(self._groups) >= self.capacity

    @property
    def records(self) -> int:
        return sum(len(g.items) for g in self._groups)

    @property
    def tokens(self) -> int:
        return sum(g.tokens for g in self._groups)

    def put(self, group: Group) -> None:
        self._groups.append(group)
        self._ids.update(i.record_id for i in group.items)

    def remove(self, keep: Callable[[Group], bool]) -> list[Group]:
        """Take out the groups `keep` refuses (e.g. stale ones) and return them."""
        dropped = [g for g in self._groups if not keep(g)]
        self._groups = deque(g for g in self._groups if keep(g))
        self._forget(dropped)
        return dropped

    def ready(self, experiences: int | None, token_budget: int | None) -> bool:
        """Enough waits for a full batch."""
        return self.records >= experiences if experiences else self.tokens >= token_budget

    def take(self, experiences: int | None, token_budget: int | None) -> list[Group]:
        """Whole groups for one batch: FIFO or by priority, until the next group would not fit."""
        groups = list(self._groups)
        order = weighted_order(groups, [max(g.priority, 1e-12) for g in groups], self._rng) \
            if self.prioritized else groups
        batch = fitting(order, experiences, token_budget)
        taken = {id(g) for g in batch}
        self._groups = deque(g for g in self._groups if id(g) not in taken)
        self._forget(batch)
        return batch

    def _forget(self, groups: list[Group]) -> None:
        self._ids.difference_update(i.record_id for g in groups for i in g.items)


T = TypeVar("T")


def weighted_order(items: Sequence[T], weights: Sequence[float], rng: random.Random) -> list[T]:
    """`items` drawn one by one without replacement, each with probability proportional to its weight
    among those left; items of weight <= 0 are never drawn (left out)."""
    left = [(item, w) for item, w in zip(items, weights) if w > 0]
    order = []
    while left:
        i = rng.choices(range(len(left)), weights=[w for _, w in left])[0]
        order.append(left.pop(i)[0])
    return order


def fitting(order: Sequence[Group], experiences: int | None, token_budget: int | None, *,
            at_least_one: bool = True) -> list[Group]:
    """The first groups of `order` whose records (or tokens) add up to at most the budget; with
    `at_least_one`, the first group even when it alone is over."""
    batch: list[Group] = []
    used_records = used_tokens = 0
    for g in order:
        fits = (used_records + len(g.items) <= experiences) if experiences is not None else \
            (used_tokens + g.tokens <= token_budget)
        if not fits and (batch or not at_least_one):
            break
        batch.append(g)
        used_records, used_tokens = used_records + len(g.items), used_tokens + g.tokens
    return batch
