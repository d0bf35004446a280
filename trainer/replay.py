"""Replay that reuses: groups the trainer already trained on, drawn again into later steps. No Kafka here.

A step of N records (or tokens) takes ⌊ratio · N⌋ of them from the buffer, whole groups that fit (a
group's advantages are relative to its own samples, so it is reused whole), and the rest fresh from
the window. The buffer is filled by the steps themselves: every fresh group trained enters it with one
use; each reuse adds one; a group trained `max_uses` times leaves, and past `capacity_groups` the
oldest leaves first. Which groups are drawn is a sampler's choice (`replay_samplers`): a function of
the buffer's groups and the trainer's version that returns one weight per group; groups are drawn
without replacement with probability proportional to their weight (weight 0: never).

A reused record is off-policy by design, so it is not held to `max_staleness` (fresh data is); the
loss corrects it with the behaviour log-probs the record keeps, r_t = π_θ(y_t) / π_behaviour(y_t):
clipped (PPO, Schulman et al. 2017, eq. 7), truncated, min(r_t, c) (IMPALA's ρ̄, Espeholt et al. 2018,
eq. 1), or decoupled around the step's proximal policy (Hilton et al. 2021, eq. 2). trainer/config.py
refuses replay with a loss that has no such ratio (`weighs_behaviour`, trainer/algorithms/__init__.py).
Prioritized replay's own correction of its sampling bias, (N · P(i))^−β (Schaul et al. 2016, §3.4), is
not applied: the draw picks which old groups come back, the loss weighs each token as above.

The buffer is the log plus offsets, not memory: a checkpoint keeps where each group's records are on
the ready topic and their use counts (`ReplaySaved`); a restart reads them back from the topic.
"""

from __future__ import annotations

import math
import random
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from pydantic import BaseModel, ConfigDict, Field

from undertow.kernel.registry import Registry

from .groups import Group, Item, Partition
from .window import Window, fitting, weighted_order


@dataclass
class ReplayGroup:
    """A trained group waiting to be reused: its records (where they are on the topic) and its uses."""

    group: Group
    uses: int  # times trained so far, its first (fresh) training included
    added_step: int  # the step that first trained it

    @property
    def policy_version(self) -> int:
        """The oldest policy that generated one of its records."""
        return min(getattr(i.record, "policy_version", 0) for i in self.group.items)


Sampler = Callable[..., list[float]]
replay_samplers: Registry[Sampler] = Registry("replay sampler")


@replay_samplers.register("uniform")
def uniform(groups: Sequence[ReplayGroup], version: int) -> list[float]:
    """Every group alike."""
    return [1.0] * len(groups)


@replay_samplers.register("priority")
def priority(groups: Sequence[ReplayGroup], version: int, *, alpha: float = 1.0) -> list[float]:
    """P(i) = p_i^α / Σ_k p_k^α with p_i the group's mean record priority (Schaul et al. 2016,
    "Prioritized Experience Replay", eq. 1); α = 0 is uniform."""
    return [max(g.group.priority, 0.0) ** alpha for g in groups]


@replay_samplers.register("age_decay")
def age_decay(groups: Sequence[ReplayGroup], version: int, *, half_life: float = 4.0) -> list[float]:
    """w_i = 2^(−age_i / half_life), age_i = version − the group's policy version: a group generated
    `half_life` versions ago is drawn half as often as a fresh one (the further behind, the more the
    clip or the importance weight discounts it anyway)."""
    return [0.5 ** (max(version - g.policy_version, 0) / half_life) for g in groups]


class SavedRecord(BaseModel):
    """Where one record of a reusable group is on its topic."""

    model_config = ConfigDict(extra="forbid")

    topic: str
    partition: int
    offset: int
    record_id: str


class ReplaySaved(BaseModel):
    """A reusable group as a checkpoint keeps it: positions on the ready topic and its use count."""

    model_config = ConfigDict(extra="forbid")

    group_id: str = Field(description="the prompt group")
    size: int = Field(description="the group's size as its records say")
    uses: int = Field(description="times trained so far, the first (fresh) training included")
    added_step: int = Field(description="the step that first trained it")
    records: list[SavedRecord] = Field(description="its records' positions, in group order")


def replay_quota(ratio: float, experiences: int | None, token_budget: int | None) -> tuple[int | None, int | None]:
    """(records, tokens) of a step's budget that replay may fill: ⌊ratio · N⌋ of whichever budget is set."""
    if experiences is not None:
        return math.floor(ratio * experiences), None
    return None, math.floor(ratio * (token_budget or 0))


@dataclass
class Mix:
    """One step's batch: fresh groups from the window, then groups reused from the buffer."""

    fresh: list[Group]
    reused: list[ReplayGroup]


def mix(window: Window, buffer: ReplayBuffer | None, ratio: float, version: int, experiences: int | None,
        token_budget: int | None, *, waited: bool) -> Mix | None:
    """Reused groups within ⌊ratio · N⌋ of the budget, then fresh groups from the window for what is
    left of it. None until the window can fill its share (or the data `waited` long enough and there is
    some): a batch needs fresh data, reuse alone never makes one. With ratio 0.25, 8 experiences and
    groups of 2: one reused group, three fresh."""
    reused = [] if buffer is None else buffer.draw(version, *replay_quota(ratio, experiences, token_budget))
    if experiences is not None:
        experiences -= sum(len(g.group.items) for g in reused)
    else:
        token_budget = (token_budget or 0) - sum(g.group.tokens for g in reused)
    if not len(window) or not (window.ready(experiences, token_budget) or waited):
        return None
    return Mix(window.take(experiences, token_budget), reused)


class ReplayBuffer:
    """At most `capacity` trained groups, oldest first; draws reuse them through the sampler."""

    def __init__(self, *, sampler: Any, capacity: int, max_uses: int, seed: int = 0):
        self.sampler = replay_samplers.resolve(sampler)
        self.capacity, self.max_uses = capacity, max_uses
        self._groups: OrderedDict[str, ReplayGroup] = OrderedDict()  # by group id, oldest first
        self._rng = random.Random(seed)
        self._plan: list[ReplayGroup] | None = None  # the next step's draw, kept until the buffer changes
        self._plan_for: tuple[int, int | None, int | None] | None = None  # (version, records, tokens) of the draw

    def __len__(self) -> int:
        return len(self._groups)

    def groups(self) -> list[ReplayGroup]:
        return list(self._groups.values())

    @property
    def records(self) -> int:
        return sum(len(g.group.items) for g in self._groups.values())

    def mean_uses(self) -> float:
        """Uses per record held (a fresh record counts one)."""
        held = self.records
        return sum(g.uses * len(g.group.items) for g in self._groups.values()) / held if held else 0.0

    def draw(self, version: int, records: int | None, tokens: int | None) -> list[ReplayGroup]:
        """Whole groups for the next step, within `records` (or `tokens`); the same draw until the
        buffer changes (a step trained), however often the trainer asks while it waits for fresh data."""
        if self._plan is None or self._plan_for != (version, records, tokens):
            held = self.groups()
            weights = self.sampler.obj(held, version, **self.sampler.kwargs)
            if len(weights) != len(held):
                raise ValueError(f"replay sampler {self.sampler.name!r} returned {len(weights)} weights "
                                 f"for {len(held)} groups")
            entry = {id(g.group): g for g in held}
            order = weighted_order([g.group for g in held], weights, self._rng)
            self._plan = [entry[id(g)] for g in fitting(order, records, tokens, at_least_one=False)]
            self._plan_for = (version, records, tokens)
        return list(self._plan)

    def add(self, items: Iterable[Item], step: int) -> None:
        """Fresh records a step trained: into the buffer with one use, by group (oldest leave past capacity)."""
        for item in items:
            gid = getattr(item.record, "group_id", item.record_id)
            size = getattr(item.record, "group_size", 1)
            entry = self._groups.get(gid)
            if entry is None:
                entry = self._groups[gid] = ReplayGroup(Group(gid, size), 1, step)
            entry.group.items.append(item)
        self._evict()

    def used(self, record_ids: set[str]) -> None:
        """Records a step reused: their groups count one more use (and leave at `max_uses`)."""
        for entry in self.groups():
            if any(i.record_id in record_ids for i in entry.group.items):
                entry.uses += 1
        self._evict()

    def discard(self, record_ids: set[str]) -> None:
        """Groups of reused records no update trained (non-finite, a failed step): not drawn again."""
        for gid, entry in list(self._groups.items()):
            if any(i.record_id in record_ids for i in entry.group.items):
                del self._groups[gid]
        self._plan = None

    def _evict(self) -> None:
        for gid in [gid for gid, g in self._groups.items() if g.uses >= self.max_uses]:
            del self._groups[gid]
        while len(self._groups) > self.capacity:
            self._groups.popitem(last=False)
        self._plan = None

    def saved(self) -> list[ReplaySaved]:
        """What a checkpoint keeps: each group's positions on the topic and its uses."""
        return [ReplaySaved(group_id=gid, size=g.group.size, uses=g.uses, added_step=g.added_step,
                            records=[SavedRecord(topic=i.partition[0], partition=i.partition[1], offset=i.offset,
                                                 record_id=i.record_id) for i in g.group.items])
                for gid, g in self._groups.items()]

    def restore(self, saved: Sequence[ReplaySaved], found: Mapping[tuple[Partition, int], Any]) -> list[str]:
        """The checkpoint's groups again, their records from `found` (read back from the topic by
        position); a group one of whose records is gone (retention) or is another record now is left
        out. Returns the ids of the groups left out."""
        lost = []
        for s in saved:
            records = [found.get(((r.topic, r.partition), r.offset)) for r in s.records]
            if any(rec is None or _id(rec) != r.record_id for rec, r in zip(records, s.records)):
                lost.append(s.group_id)
                continue
            items = [Item(rec, (r.topic, r.partition), r.offset) for rec, r in zip(records, s.records)]
            self._groups[s.group_id] = ReplayGroup(Group(s.group_id, s.size, items), s.uses, s.added_step)
        self._evict()
        return lost


def _id(record: Any) -> str:
    return Item(record, ("", 0), 0).record_id
