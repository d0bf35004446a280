"""Which item of a taskset the feeder draws next: `feeder.selector`, a registry.

sequential    the items in order, every epoch
shuffle       a fresh seeded order every epoch (the default)
easy_to_hard  the items sorted by a metadata field (or by prompt length), easiest first, every epoch
difficulty    weight floor + (1 - floor) * 4p(1 - p) on each item's pass rate p from <ns>.task-stats
bots          Thompson sampling on each item's Beta posterior (BOTS, arXiv 2510.26374):
                  theta_i ~ Beta(alpha0 + s_i, beta0 + f_i)    s_i, f_i: successes, failures so far
                  pick argmin_i |theta_i - target|             among `candidates` items drawn at random
              An item never tried has the prior's spread, so it gets tried; one whose posterior sits
              far from the target rarely comes back. `max_evidence` caps s_i + f_i (scaled down
              together): the policy moves, so old outcomes should not pin a pass rate for ever.

A selector asks for pass rates by saying `uses_pass_rates`; those are steered by what the stream
reports, so a restarted feeder cannot replay their draws (it only moves its counters on).
"""

from __future__ import annotations

import random
from typing import Any, Callable, ClassVar, Protocol, Sequence

from undertow.kernel.registry import Registry

from undertow.rollout.feeder.items import TaskItem

Counts = Callable[[TaskItem], tuple[int, int]]  # an item's (attempts, successes) on the task-stats topic


class Selector(Protocol):
    uses_pass_rates: ClassVar[bool]

    def pick(self, items: Sequence[TaskItem], draw: int, counts: Counts, rng: random.Random) -> int:
        """The index of the next item among `items`; `draw` counts the taskset's draws so far."""


selectors: Registry[Any] = Registry("selector")


class _Epochs:
    """Every item once per epoch, in `order(items, rng)`, drawn again at each epoch's start."""

    uses_pass_rates: ClassVar[bool] = False

    def __init__(self) -> None:
        self._order: list[int] = []

    def pick(self, items: Sequence[TaskItem], draw: int, counts: Counts, rng: random.Random) -> int:
        position = draw % len(items)
        if position == 0:
            self._order = self.order(items, rng)
        return self._order[position]

    def order(self, items: Sequence[TaskItem], rng: random.Random) -> list[int]:
        raise NotImplementedError


@selectors.register("sequential")
class Sequential(_Epochs):
    def order(self, items: Sequence[TaskItem], rng: random.Random) -> list[int]:
        return list(range(len(items)))


@selectors.register("shuffle")
class Shuffle(_Epochs):
    def order(self, items: Sequence[TaskItem], rng: random.Random) -> list[int]:
        order = list(range(len(items)))
        rng.shuffle(order)
        return order


@selectors.register("easy_to_hard")
class EasyToHard(_Epochs):
    """Easiest first by `metadata[by]` (ascending, or descending with `higher_is_easier`, e.g. a
    pass rate from `undertow prepare`'s difficulty scoring; ties keep the source's order), or by
    prompt length when `by` is not set."""

    def __init__(self, *, by: str | None = None, higher_is_easier: bool = False) -> None:
        super().__init__()
        self.by, self.sign = by, -1.0 if higher_is_easier else 1.0

    def order(self, items: Sequence[TaskItem], rng: random.Random) -> list[int]:
        return sorted(range(len(items)), key=lambda i: self.sign * self._difficulty(items[i]))

    def _difficulty(self, item: TaskItem) -> float:
        if self.by is None:
            return float(len(item.prompt) + sum(len(m.get("content", "")) for m in item.messages))
        if self.by not in item.metadata:
            raise ValueError(f"selector easy_to_hard: item {item.key!r} has no metadata field {self.by!r}")
        return float(item.metadata[self.by])


def difficulty_weight(pass_rate: float, floor: float) -> float:
    """Selection weight of an item: 1 at pass rate 1/2, `floor` for always / never solved.

    4p(1-p) is the variance of a Bernoulli(p) reward scaled to 1 at p = 1/2: groups whose samples all
    succeed or all fail carry no group-relative advantage (GRPO), so they teach nothing.
    """
    return floor + (1.0 - floor) * 4.0 * pass_rate * (1.0 - pass_rate)


@selectors.register("difficulty")
class Difficulty:
    """Items drawn with weight `difficulty_weight(p)`; an item with fewer than `min_attempts`
    attempts weighs 1 (untried items are worth trying)."""

    uses_pass_rates: ClassVar[bool] = True

    def __init__(self, *, min_attempts: int = 4, floor: float = 0.05) -> None:
        if min_attempts < 1 or not 0 < floor <= 1:
            raise ValueError("selector difficulty: min_attempts >= 1 and 0 < floor <= 1")
        self.min_attempts, self.floor = min_attempts, floor

    def pick(self, items: Sequence[TaskItem], draw: int, counts: Counts, rng: random.Random) -> int:
        weights = []
        for item in items:
            attempts, successes = counts(item)
            weights.append(1.0 if attempts < self.min_attempts else difficulty_weight(successes / attempts, self.floor))
        return rng.choices(range(len(items)), weights=weights)[0]


@selectors.register("bots")
class Bots:
    """Thompson sampling toward a target pass rate (see the module's equations)."""

    uses_pass_rates: ClassVar[bool] = True

    def __init__(self, *, target: float = 0.5, candidates: int = 256, alpha0: float = 1.0, beta0: float = 1.0,
                 max_evidence: float | None = 64.0) -> None:
        if not 0 < target < 1 or candidates < 1 or alpha0 <= 0 or beta0 <= 0:
            raise ValueError("selector bots: 0 < target < 1, candidates >= 1, alpha0 > 0, beta0 > 0")
        if max_evidence is not None and max_evidence <= 0:
            raise ValueError("selector bots: max_evidence > 0 (or null: no cap)")
        self.target, self.candidates = target, candidates
        self.alpha0, self.beta0, self.max_evidence = alpha0, beta0, max_evidence

    def posterior(self, attempts: int, successes: int) -> tuple[float, float]:
        """(alpha, beta) of an item's pass-rate posterior."""
        s, f = float(successes), float(attempts - successes)
        if self.max_evidence is not None and s + f > self.max_evidence:
            scale = self.max_evidence / (s + f)
            s, f = s * scale, f * scale
        return self.alpha0 + s, self.beta0 + f

    def pick(self, items: Sequence[TaskItem], draw: int, counts: Counts, rng: random.Random) -> int:
        pool = range(len(items)) if len(items) <= self.candidates else rng.sample(range(len(items)), self.candidates)
        best, best_gap = 0, float("inf")
        for i in pool:
            theta = rng.betavariate(*self.posterior(*counts(items[i])))
            if abs(theta - self.target) < best_gap:
                best, best_gap = i, abs(theta - self.target)
        return best
