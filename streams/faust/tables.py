"""Keyed state for a Faust agent in a Faust table: local data, changelogged to the record's partition."""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterator

from kafka.partitioner.default import murmur2


class TableStore:
    """A StateStore over a Faust table's local data, writing each change to the changelog partition
    of the record's own Kafka key, the way the default partitioner placed the record."""

    def __init__(self, table: Any, partitions: int):
        self.table, self.partitions = table, partitions
        self.partition_of = lru_cache(maxsize=1 << 16)(self._partition_of)

    def _partition_of(self, route: bytes) -> int:
        return (murmur2(route) & 0x7FFFFFFF) % self.partitions

    def get(self, key: bytes) -> bytes | None:
        return self.table.data.get(key)

    def put(self, key: bytes, value: bytes, route: bytes) -> None:
        self.table.data[key] = value
        self.table.send_changelog(self.partition_of(route), key, value, key_serializer="raw", value_serializer="raw")

    def delete(self, key: bytes, route: bytes) -> None:
        self.table.data.pop(key, None)
        self.table.send_changelog(self.partition_of(route), key, None, key_serializer="raw", value_serializer="raw")

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(list(self.table.data.items()))

    def shard(self, route: bytes) -> int:
        return self.partition_of(route)

    def __len__(self) -> int:
        return len(self.table.data)
