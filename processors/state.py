"""Bounded state of the processors: key/value stores, and the dedupe window built on one.

A StateStore holds bytes by bytes key. `route` is the Kafka key of the record the entry belongs to
(its group id): the Faust runner uses it to write the entry to the changelog partition that
belongs to the record's own partition, so state moves with its partition when workers rebalance;
`shard(route)` names that partition (the in-memory store has one shard and ignores routes).
Every put/delete may cost a changelog record, so state users write once per batch (`flush`).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import msgpack

from undertow.schemas import Experience


class StateStore(Protocol):
    def get(self, key: bytes) -> bytes | None: ...
    def put(self, key: bytes, value: bytes, route: bytes) -> None: ...
    def delete(self, key: bytes, route: bytes) -> None: ...
    def items(self) -> Iterator[tuple[bytes, bytes]]: ...
    def shard(self, route: bytes) -> int: ...
    def __len__(self) -> int: ...


class MemoryStore:
    """A dict: the store of the no-broker harness and of unit tests (one shard)."""

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

    def shard(self, route: bytes) -> int:
        return 0

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


@dataclass(slots=True)
class _Bucket:
    """Hashes first seen in one batch on one shard: a single store entry, evicted as a whole."""

    route: bytes
    last_seen: float
    hashes: list[bytes] = field(default_factory=list)
    stored: bool = False


class DedupeWindow:
    """Remembers content hashes for `window_s` seconds, at most `max_entries` of them (oldest evicted).

    Hashes persist in buckets, one store entry per shard and batch (`flush`): a changelogged store
    then writes one record per batch and partition instead of one per sample, and eviction deletes
    whole buckets. A bucket holds at most max_entries / 16 hashes, so one eviction forgets at most
    ~1/16 of the window.
    """

    def __init__(self, store: StateStore, *, window_s: float, max_entries: int):
        self.store, self.window_s, self.max_entries = store, window_s, max_entries
        self.bucket_size = max(1, max_entries // 16)
        self._hashes: set[bytes] = set()
        self._buckets: dict[bytes, _Bucket] = {}  # store key (its first hash) -> bucket, oldest first
        self._filling: dict[int, bytes] = {}  # shard -> key of the bucket taking new hashes
        self._dirty: set[bytes] = set()  # buckets changed since the last flush
        self._entries = 0
        self._restore()

    def seen(self, key: bytes, route: bytes, now: float) -> bool:
        """True if `key` was seen within the window; otherwise records it and returns False."""
        self._evict(now)
        if key in self._hashes:
            return True
        self._hashes.add(key)
        shard = self.store.shard(route)
        bucket = self._buckets.get(self._filling.get(shard, b""))
        if bucket is None or len(bucket.hashes) >= self.bucket_size:
            bucket = self._buckets[key] = _Bucket(route, now)
            self._filling[shard] = key
        bucket.hashes.append(key)
        bucket.last_seen = now
        self._dirty.add(self._filling[shard])
        self._entries += 1
        return False

    def flush(self) -> None:
        """Write the buckets changed since the last flush to the store (once per batch)."""
        for key in self._dirty:
            bucket = self._buckets.get(key)
            if bucket is not None:
                self.store.put(key, msgpack.packb([bucket.last_seen, bucket.route, bucket.hashes]), bucket.route)
                bucket.stored = True
        self._dirty.clear()
        self._filling.clear()

    def __len__(self) -> int:
        return len(self._hashes)

    def _evict(self, now: float) -> None:
        if len(self.store) > len(self._buckets):  # entries restored into the store after a rebalance
            self._restore()
        while self._buckets:
            key, bucket = next(iter(self._buckets.items()))
            if bucket.last_seen > now - self.window_s and self._entries < self.max_entries:
                break
            del self._buckets[key]
            self._dirty.discard(key)
            self._hashes.difference_update(bucket.hashes)
            self._entries -= len(bucket.hashes)
            if bucket.stored:
                self.store.delete(key, bucket.route)

    def _restore(self) -> None:
        found = {k: _unpack_bucket(k, v) for k, v in self.store.items() if k not in self._buckets}
        for bucket in found.values():
            self._hashes.update(bucket.hashes)
            self._entries += len(bucket.hashes)
        if found:
            self._buckets = dict(sorted({**self._buckets, **found}.items(), key=lambda kv: kv[1].last_seen))


def _unpack_bucket(key: bytes, value: bytes) -> _Bucket:
    fields = msgpack.unpackb(value)
    if len(fields) == 2:  # one hash per entry, as written before buckets: [seen at, route]
        return _Bucket(fields[1], fields[0], [key], stored=True)
    last_seen, route, hashes = fields
    return _Bucket(route, last_seen, list(hashes), stored=True)


def describe(exp: Experience) -> str:
    return f"{exp.experience_id} (group {exp.group_id}, sample {exp.sample_index})"
