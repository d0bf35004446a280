"""Each raw record handled once and in offset order, and commits that never pass an unfinished one.

Faust's delivery around a (re)start is not what its commits assume. Seen in the processors-kill
fault test and reproduced by killing a worker under load: a restarted worker's streams receive a
run of records, then miss tens of offsets in every partition at once, and sometimes get one offset
twice; Faust's commit books then creep past the missing records (its check for a missing head is
off by one: committed 33 and acknowledged [34, 35] commits 36), and they are lost.

`InOrder` is the agent's own book: per partition, the next offset it expects. A record below it was
handled already and is skipped; one above it means records went missing upstream, so the runner
seeks the partition back to the expected offset. Commits come from the same book: a partition is
committed up to the end of the last batch whose outputs the broker acknowledged, never further.
The consumer (`booked_consumer`) drops what a partition delivers after such a seek until the
offset sought arrives: records fetched before the seek would otherwise move Faust's read position
past it, and Faust drops what arrives behind its read position. `CommitWatch` is the backstop for
what the book cannot see, records Faust never hands to the streams (seen once in ~30 restarts: a
record fetched while a new worker seeks to its commits, then nothing): a partition whose commit
stands still for `stall_s` while records wait past it is read again from its commit.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, AsyncIterator, Optional

from faust.transport.drivers.aiokafka import Consumer
from faust.types import TP, Message


class Verdict(Enum):
    TAKE = "take"  # the next record of its partition: handle it
    HANDLED = "handled"  # below the next expected offset: handled already
    EARLY = "early"  # records before it never arrived: seek back to them


class InOrder:
    """The next offset expected per partition, and the offset each partition may be committed to."""

    def __init__(self) -> None:
        self._next: dict[Any, int] = {}  # partition -> next offset to hand to the pipeline
        self._done: dict[Any, int] = {}  # partition -> next offset after the last published batch
        self._sought: dict[Any, int] = {}  # partition -> offset a seek was asked for, until it arrives

    def admit(self, tp: Any, offset: int, committed: Optional[int]) -> Verdict:
        """Where the record at `offset` stands. A partition first seen starts at its committed
        offset (the next to read), or at this record if it has none."""
        expected = self._next.setdefault(tp, offset if committed is None else committed)
        if offset < expected:
            return Verdict.HANDLED
        if offset > expected:
            return Verdict.EARLY
        self._next[tp] = offset + 1
        self._sought.pop(tp, None)
        return Verdict.TAKE

    def rewind(self, tp: Any) -> Optional[int]:
        """The offset to seek `tp` back to after an EARLY record; None while a seek there is pending."""
        target = self._next[tp]
        if self._sought.get(tp) == target:
            return None
        self._sought[tp] = target
        return target

    def published(self) -> None:
        """What was taken so far is acknowledged by the broker: commit up to it."""
        self._done.update(self._next)

    def committable(self, tp: Any, committed: Optional[int]) -> Optional[int]:
        """The offset to commit `tp` to now, or None to leave it where it is."""
        done = self._done.get(tp)
        return done if done is not None and (committed is None or done > committed) else None

    def forget(self, tps: set) -> None:
        """Partitions taken away by a rebalance: a later assignment starts from their commit."""
        for tp in tps:
            for book in (self._next, self._done, self._sought):
                book.pop(tp, None)


def booked_consumer(books: InOrder, topic: str) -> type[Consumer]:
    """Faust's aiokafka consumer, committing `topic` from `books` instead of its acknowledgements,
    and delivering nothing of a partition after a seek until the offset sought."""

    class BookedConsumer(Consumer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._sought: dict[TP, int] = {}  # partition -> offset sought, until it arrives

        def _new_offset(self, tp: TP) -> Optional[int]:
            faust = super()._new_offset(tp)  # called anyway: it trims Faust's acknowledgement books
            return books.committable(tp, self._committed_offset[tp]) if tp.topic == topic else faust

        async def seek(self, partition: TP, offset: int) -> None:
            self._sought[partition] = offset
            await super().seek(partition, offset)

        async def getmany(self, timeout: float) -> AsyncIterator[tuple[TP, Message]]:
            sought = self._sought
            async for tp, message in super().getmany(timeout):
                target = sought.get(tp)
                if target is None:
                    yield tp, message
                elif message.offset == target:
                    del sought[tp]
                    # A record fetched before the seek may have moved the read position past it since.
                    self._read_offset[tp] = target
                    yield tp, message

    return BookedConsumer


class CommitWatch:
    """Partitions whose commit stands still while records wait past it: a delivery Faust lost."""

    def __init__(self, stall_s: float):
        self.stall_s = stall_s
        self._still: dict[Any, tuple[Optional[int], float]] = {}  # partition -> (commit, since when)

    def stuck(self, end: dict, committed: dict, now: float) -> list[tuple[Any, str]]:
        """Partitions whose commit has not moved for `stall_s` while records wait past it, each with why.

        `end`: the offset the next record written will get; `committed`: the next offset to read,
        as committed (None: nothing yet). A partition reported, or left out of `end`, is watched afresh.
        """
        for tp in set(self._still) - set(end):
            del self._still[tp]  # no longer assigned, or not watched for now
        out = []
        for tp, last in end.items():
            done = committed.get(tp)
            if last is None or (done or 0) >= last:
                self._still.pop(tp, None)  # nothing waits
                continue
            seen = self._still.get(tp)
            if seen is None or seen[0] != done:  # the commit moved: watch it afresh
                self._still[tp] = (done, now)
            elif now - seen[1] > self.stall_s:
                out.append((tp, f"the commit stayed at {done} for {now - seen[1]:.0f} s "
                                f"while records up to {last - 1} waited"))
                del self._still[tp]
        return out
