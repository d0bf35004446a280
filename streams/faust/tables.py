"""Keyed state for a Faust agent in a Faust table: local data, changelogged to the record's partition.

A change is kept until the worker takes it with the job call that made it (`take_changes`) and sends
it once that call's outputs are acknowledged (`send`): the changelog is never ahead of the outputs.
Ahead, a worker killed between the two would, restarted, rebuild state that says a record was handled
(clean's dedupe window) while its output never reached the broker, and reject that record, read
again, as a duplicate. Behind, the same kill costs at most a duplicate, which the trainer's ledger drops.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Iterator

from kafka.partitioner.default import murmur2

Change = tuple[int, bytes, bytes | None]  # changelog partition, key, value (None: deleted)


class TableStore:
    """A StateStore over a Faust table's local data, each change bound for the changelog partition of
    the record's own Kafka key, the way the default partitioner placed the record."""

    def __init__(self, table: Any, partitions: int):
        self.table, self.partitions = table, partitions
        self.changes: list[Change] = []  # made by the job, not yet sent
        self.partition_of = lru_cache(maxsize=1 << 16)(self._partition_of)

    def _partition_of(self, route: bytes) -> int:
        return (murmur2(route) & 0x7FFFFFFF) % self.partitions

    def get(self, key: bytes) -> bytes | None:
        return self.table.data.get(key)

    def put(self, key: bytes, value: bytes, route: bytes) -> None:
        self.table.data[key] = value
        self.changes.append((self.partition_of(route), key, value))

    def delete(self, key: bytes, route: bytes) -> None:
        self.table.data.pop(key, None)
        self.changes.append((self.partition_of(route), key, None))

    def take_changes(self) -> list[Change]:
        """The changes made since the last take (on the job's thread, right after its call)."""
        changes, self.changes = self.changes, []
        return changes

    async def send(self, changes: list[Change]) -> None:
        """Hand changes to the producer (on the event loop), which a commit flushes first: no source
        offset is committed ahead of the state it produced."""
        # Straight to the producer, as the outputs go, not through the table's send_changelog: that
        # queues each in Faust's buffer, which hands them to the producer one at a time, later still.
        # Its callback only records a persistent store's offsets (the memory store keeps none).
        send, topic = self.table.app.producer.send, self.table.changelog_topic.get_topic_name()
        for partition, key, value in changes:
            await send(topic, key, value, partition, None, None)

    def items(self) -> Iterator[tuple[bytes, bytes]]:
        return iter(list(self.table.data.items()))

    def shard(self, route: bytes) -> int:
        return self.partition_of(route)

    def __len__(self) -> int:
        return len(self.table.data)
