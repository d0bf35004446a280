"""Group assembly: gather the samples of one prompt until all `group_size` arrived or time runs out.

The state of every open group lives in a StateStore (a Faust table in the runner, so a restarted
worker resumes its open groups from the changelog), keyed by group id, and is mirrored in memory
for speed. Memory is bounded: a group leaves when complete, after `timeout_s`, or when more than
`max_open` groups are open (oldest first). The ids of the last `max_open` closed groups are
remembered (in memory only) so that a late or redelivered sample does not open a phantom group.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

import msgpack

from undertow.schemas import Experience, decode, encode
from undertow.processors.state import StateStore


@dataclass
class Arrival:
    """An experience and where it was read from (None in the harness)."""

    experience: Experience
    partition: int | None = None
    offset: int | None = None
    _encoded: bytes | None = field(default=None, repr=False, compare=False)

    def encoded(self) -> bytes:
        """The experience's wire bytes, encoded once (an open group is stored again each batch it grows)."""
        if self._encoded is None:
            self._encoded = encode(self.experience)
        return self._encoded


@dataclass
class OpenGroup:
    group_id: str
    group_size: int
    first_seen: float
    members: dict[int, Arrival] = field(default_factory=dict)  # sample index -> arrival
    dropped: set[int] = field(default_factory=set)  # sample indices an earlier stage rejected

    @property
    def complete(self) -> bool:
        return len(self.members.keys() | self.dropped) >= self.group_size

    def sorted_members(self) -> list[Arrival]:
        return [self.members[i] for i in sorted(self.members)]

    def to_bytes(self) -> bytes:
        members = [[i, a.encoded(), a.partition, a.offset] for i, a in self.members.items()]
        return msgpack.packb([self.group_size, self.first_seen, members, sorted(self.dropped)], use_bin_type=True)

    @classmethod
    def from_bytes(cls, group_id: str, data: bytes) -> "OpenGroup":
        size, first, members, dropped = msgpack.unpackb(data, raw=False)
        arrivals = {i: Arrival(decode(b, expect=Experience), p, o, b) for i, b, p, o in members}
        return cls(group_id, size, first, arrivals, set(dropped))


@dataclass
class Closed:
    """A group that left the buffer: `members` in sample order; `timed_out` if it is partial."""

    group_id: str
    members: list[Arrival]
    timed_out: bool
    expected: int


class GroupBuffer:
    def __init__(self, store: StateStore, *, timeout_s: float, max_open: int):
        self.store, self.timeout_s, self.max_open = store, timeout_s, max_open
        self._open: dict[str, OpenGroup] = {}  # insertion order = first seen order
        self._dirty: set[str] = set()  # open groups changed since the last flush
        self._closed: OrderedDict[str, None] = OrderedDict()  # recently closed group ids, oldest first

    def __len__(self) -> int:
        return len(self._open)

    def add(self, arrival: Arrival, now: float) -> Closed | str | None:
        """Buffer one sample: the closed group if it completed it, a reason string if refused, else None."""
        exp = arrival.experience
        if exp.group_id in self._closed:
            return "late_sample"
        group = self._group(exp, now)
        if exp.group_size != group.group_size:
            return f"group_size {exp.group_size} != {group.group_size} of earlier samples"
        if exp.sample_index in group.members:
            return "duplicate_sample"
        group.members[exp.sample_index] = arrival
        return self._after_change(group)

    def mark_dropped(self, exp: Experience, now: float) -> Closed | None:
        """Count a sample an earlier stage rejected, so its group can still complete."""
        if exp.group_id in self._closed:
            return None
        group = self._group(exp, now)
        if exp.sample_index in group.members or exp.sample_index >= group.group_size:
            return None
        group.dropped.add(exp.sample_index)
        return self._after_change(group)

    def expired(self, now: float) -> list[Closed]:
        """Groups open longer than the timeout, or beyond `max_open`, removed from the buffer."""
        self._restore()
        out = []
        while self._open:
            group = next(iter(self._open.values()))
            if group.first_seen > now - self.timeout_s and len(self._open) <= self.max_open:
                break
            out.append(self._close(group, timed_out=True))
        return out

    def _group(self, exp: Experience, now: float) -> OpenGroup:
        group = self._open.get(exp.group_id)
        if group is None:
            stored = self.store.get(exp.group_id.encode())
            group = (OpenGroup.from_bytes(exp.group_id, stored) if stored is not None
                     else OpenGroup(exp.group_id, exp.group_size, now))
            self._open[exp.group_id] = group
        return group

    def _after_change(self, group: OpenGroup) -> Closed | None:
        if group.complete:
            return self._close(group, timed_out=False)
        self._dirty.add(group.group_id)
        return None

    def flush(self) -> None:
        """Store each group changed since the last flush once: a group that completes within a batch
        is never written, and one that gained several samples is written once, not per sample."""
        for group_id in self._dirty:
            key = group_id.encode()
            self.store.put(key, self._open[group_id].to_bytes(), key)
        self._dirty.clear()

    def _close(self, group: OpenGroup, timed_out: bool) -> Closed:
        del self._open[group.group_id]
        self._dirty.discard(group.group_id)
        self._closed[group.group_id] = None
        if len(self._closed) > self.max_open:
            self._closed.popitem(last=False)
        key = group.group_id.encode()
        if self.store.get(key) is not None:
            self.store.delete(key, key)
        return Closed(group.group_id, group.sorted_members(), timed_out, group.group_size)

    def _restore(self) -> None:
        """Pick up groups that appeared in the store without passing through here (a changelog restore)."""
        if len(self.store) <= len(self._open):
            return
        found = [OpenGroup.from_bytes(k.decode(), v) for k, v in self.store.items() if k.decode() not in self._open]
        for group in sorted(found, key=lambda g: g.first_seen):
            self._open[group.group_id] = group
