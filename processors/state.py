"""Bounded state of the processors: key/value stores, and the dedupe window built on one.

A StateStore holds bytes by bytes key. `route` is the Kafka key of the record the entry belongs to
(its group id): the Faust runner uses it to write the entry to the changelog partition that
belongs to the record's own partition, so state moves with its partition when workers rebalance.
The in-memory store ignores it.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import msgpack

from schemas import Experience


class StateStore(Protocol):
    def get(self, key: bytes) -> bytes | None: ...
    def put(self, key: bytes, value: bytes, route: bytes) -> None: ...
    def delete(self, key: bytes, route: bytes) -> None: ...
    def items(self) -> Iterator[tuple[bytes, bytes]]: ...
    def __len__(self) -> int: ...


class MemoryStore:
    """A dict: the store of the no-broker harness and of unit tests."""

    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}

    def get(self, key: bytes) -> bytes | None:
        return self.data.get(key)

    def put(self, key: bytes, value: bytes, route: bytes) -> None:
        self.data[key] = value

    def delete(self, key: bytes, route: bytes) -> None:
        self.data.pop(key, None)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(list(self.data.items()))

    def __len__(self) -> int:
        return len(self.data)


@dataclass
class StageContext:
    """What the pipeline hands a stage's `bind`: named stores and the clock (seconds)."""

    store: Callable[[str], StateStore] = field(default_factory=lambda: _memory_stores())
    clock: Callable[[], float] = time.time


def _memory_stores() -> Callable[[str], StateStore]:
    stores: dict[str, StateStore] = {}
    return lambda name: stores.setdefault(name, MemoryStore())


def content_hash(*parts: str) -> bytes:
    """A 16-byte digest of text parts; blake2b is fast and collisions are negligible at this size."""
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.digest()


class DedupeWindow:
    """Remembers content hashes for `window_s` seconds, at most `max_entries` of them (oldest evicted)."""

    def __init__(self, store: StateStore, *, window_s: float, max_entries: int):
        self.store, self.window_s, self.max_entries = store, window_s, max_entries
        self._order: OrderedDict[bytes, tuple[float, bytes]] = OrderedDict()  # key -> (seen at, route)
        self._restore()

    def seen(self, key: bytes, route: bytes, now: float) -> bool:
        """True if `key` was seen within the window; otherwise records it and returns False."""
        self._evict(now)
        if key in self._order or self.store.get(key) is not None:
            return True
        self._order[key] = (now, route)
        self.store.put(key, msgpack.packb([now, route]), route)
        return False

    def __len__(self) -> int:
        return len(self._order)

    def _evict(self, now: float) -> None:
        if len(self.store) > len(self._order):  # entries restored into the store after a rebalance
            self._restore()
        while self._order:
            key, (seen_at, route) = next(iter(self._order.items()))
            if seen_at > now - self.window_s and len(self._order) < self.max_entries:
                break
            del self._order[key]
            self.store.delete(key, route)

    def _restore(self) -> None:
        entries = [(k, msgpack.unpackb(v)) for k, v in self.store.items()]
        for key, (seen_at, route) in sorted(entries, key=lambda e: e[1][0]):
            self._order.setdefault(key, (seen_at, route))


def describe(exp: Experience) -> str:
    return f"{exp.experience_id} (group {exp.group_id}, sample {exp.sample_index})"
