"""The commit book: which task offsets a continuously batching worker may commit (pure; no Kafka).

With continuous batching tasks finish out of order: a short group read after a long one is published
first. A Kafka offset commit says "everything before this offset is done", so a partition's offset
moves only past the contiguous prefix of its tasks that are settled: read, finished (its experiences,
or its dead letter, sent) and acknowledged (every send's future done). A task finished out of order
waits in the book for the ones before it. A crash then redelivers exactly the tasks not yet behind
the committed offset: some may have been published already (their ids are deterministic, so the
trainer drops the repeats), none is lost.

Acknowledgements are anything with an `is_done` attribute (kafka-python's send futures); whether one
failed is the producer's flush to say (RecordProducer.flush raises), which the commit runs first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

Partition = tuple[str, int]


@dataclass
class _Entry:
    finished: bool = False
    acks: list[Any] = field(default_factory=list)

    def settled(self) -> bool:
        return self.finished and all(a.is_done for a in self.acks)


@dataclass
class CommitBook:
    """Per partition, the tasks read and not yet committed, by offset."""

    _open: dict[Partition, dict[int, _Entry]] = field(default_factory=dict)

    def read(self, partition: Partition, offset: int) -> None:
        """A task taken into work (admitted): its offset may not be committed until it settles."""
        self._open.setdefault(partition, {})[offset] = _Entry()

    def finished(self, partition: Partition, offset: int, acks: Iterable[Any]) -> None:
        """The task's outputs are sent; `acks` resolve when the brokers acknowledge them. A task of a
        partition forgotten meanwhile is not in the book: its partition's tasks are read again."""
        entry = self._open.get(partition, {}).get(offset)
        if entry is not None:
            entry.finished, entry.acks = True, list(acks)

    def committable(self) -> dict[Partition, int]:
        """Per partition whose settled prefix grew since the last commit: the offset after it."""
        out: dict[Partition, int] = {}
        for partition, entries in self._open.items():
            settled = None
            for offset in sorted(entries):
                if not entries[offset].settled():
                    break
                settled = offset
            if settled is not None:
                out[partition] = settled + 1
        return out

    def committed(self, offsets: dict[Partition, int]) -> None:
        """`offsets` were committed: their tasks leave the book."""
        for partition, upto in offsets.items():
            entries = self._open.get(partition, {})
            for offset in [o for o in entries if o < upto]:
                del entries[offset]

    def pending(self) -> int:
        """Tasks read and not yet committed."""
        return sum(len(entries) for entries in self._open.values())

    def forget(self, partitions: Iterable[Partition] | None = None) -> None:
        """Partitions this worker lost (a rebalance; None: all of them): whoever holds them next reads
        their uncommitted tasks again."""
        for partition in list(self._open) if partitions is None else partitions:
            self._open.pop(partition, None)
