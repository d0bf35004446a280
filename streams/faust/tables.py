"""Keyed state for a Faust agent in a Faust table: local data, changelogged to the record's partition.

The job that writes it runs on a thread of its own (worker.py's JobThread), while Faust's producer
belongs to the event loop: a changelog write made off the loop is handed to the loop, in order.
"""

from __future__ import annotations

import asyncio
from functools import lru_cache
from typing import Any, Iterator

from kafka.partitioner.default import murmur2


class TableStore:
    """A StateStore over a Faust table's local data, writing each change to the changelog partition
    of the record's own Kafka key, the way the default partitioner placed the record."""

    def __init__(self, table: Any, partitions: int):
        self.table, self.partitions = table, partitions
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the worker: changelog sends go through it
        self.partition_of = lru_cache(maxsize=1 << 16)(self._partition_of)

    def _partition_of(self, route: bytes) -> int:
        return (murmur2(route) & 0x7FFFFFFF) % self.partitions

    def get(self, key: bytes) -> bytes | None:
        return self.table.data.get(key)

    def put(self, key: bytes, value: bytes, route: bytes) -> None:
        self.table.data[key] = value
        self._changelog(self.partition_of(route), key, value)

    def delete(self, key: bytes, route: bytes) -> None:
        self.table.data.pop(key, None)
        self._changelog(self.partition_of(route), key, None)

    def _changelog(self, partition: int, key: bytes, value: bytes | None) -> None:
        send = self.table.send_changelog
        kw = {"key_serializer": "raw", "value_serializer": "raw"}
        if self.loop is None:
            send(partition, key, value, **kw)
        else:  # FIFO on the loop: these run before the batch's own sends, which await the job's return
            self.loop.call_soon_threadsafe(lambda: send(partition, key, value, **kw))

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(list(self.table.data.items()))

    def shard(self, route: bytes) -> int:
        return self.partition_of(route)

    def __len__(self) -> int:
        return len(self.table.data)
