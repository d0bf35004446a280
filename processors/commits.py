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
past it, and Faust drops what arrives behind its read position. `DeliveryWatch` is the backstop for
what the book cannot see, records Faust never hands to the streams (seen once in ~30 restarts: a
record fetched while a new worker seeks to its commits, then nothing). It judges a partition by
what the consumer offered and the worker took, not by its commit: a partition whose commit stands
still because a backlog of other partitions is drained first is waiting its turn, not lost.
"""

from __future__ import annotations

from dataclasses import dataclass
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

    def expected(self, tp: Any) -> Optional[int]:
        """The next offset to hand to the pipeline; None for a partition not seen yet."""
        return self._next.get(tp)

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


def booked_consumer(books: InOrder, topic: str, watch: "DeliveryWatch") -> type[Consumer]:
    """Faust's aiokafka consumer, committing `topic` from `books` instead of its acknowledgements,
    delivering nothing of a partition after a seek until the offset sought, and telling `watch`
    what it offers."""

    class BookedConsumer(Consumer):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._sought: dict[TP, int] = {}  # partition -> offset sought, until it arrives

        def _new_offset(self, tp: TP) -> Optional[int]:
            faust = super()._new_offset(tp)  # called anyway: it trims Faust's acknowledgement books
            return books.committable(tp, self._committed_offset[tp]) if tp.topic == topic else faust

        async def seek(self, partition: TP, offset: int) -> None:
            self._sought[partition] = offset
            watch.forget({partition})
            await super().seek(partition, offset)

        async def getmany(self, timeout: float) -> AsyncIterator[tuple[TP, Message]]:
            sought = self._sought
            async for tp, message in super().getmany(timeout):
                target = sought.get(tp)
                if target is not None and message.offset != target:
                    continue
                if target is not None:
                    del sought[tp]
                    # A record fetched before the seek may have moved the read position past it since.
                    self._read_offset[tp] = target
                if tp.topic == topic:
                    watch.offer(tp, message.offset, len(message.value or b""))
                yield tp, message

    return BookedConsumer


@dataclass
class _Mark:
    """Where a partition stood when the watch began to wait on it."""

    kind: str  # "handled": offered records wait to be handled; "offered": records wait to be fetched
    offset: int  # the offset that has to move: the next to handle, or the next to be offered
    since: float
    handled: int  # the worker's records handled so far, all partitions
    offered_bytes: int  # the consumer's bytes offered so far, all partitions


class DeliveryWatch:
    """Partitions the worker no longer serves, told apart from partitions that wait their turn.

    Two ways a partition can stop, each measured against the worker's progress elsewhere rather
    than against a clock, so that a backlog of any size drains without a false alarm:
    - offered, not handled: the consumer handed records of the partition to Faust, and the worker
      then took more than `in_flight` records (what Faust's stream buffer can hold ahead of them)
      without reaching them: Faust dropped them (seen around restarts, behind its read position);
    - waiting, never offered: records wait on the broker and the consumer offered more than
      `round_bytes` of other partitions (several fair fetch rounds) without one of this partition.
    Either also counts when the whole worker took nothing and was offered nothing for `idle_s`
    while records waited. The remedy is a seek to the next offset to handle: harmless if the
    watch was wrong, since the book skips what was handled already.
    """

    def __init__(self, idle_s: float, in_flight: int, round_bytes: int):
        self.idle_s, self.in_flight, self.round_bytes = idle_s, in_flight, round_bytes
        self.handled = 0  # records the worker took from its stream, all partitions
        self.offered_bytes = 0  # bytes the consumer handed to Faust, all partitions
        self._offered: dict[Any, int] = {}  # partition -> next offset after the last record offered
        self._marks: dict[Any, _Mark] = {}
        self._totals: tuple[int, int] | None = None  # (handled, offered_bytes) at the last look
        self._active = 0.0  # when they last moved

    def offer(self, tp: Any, offset: int, size: int) -> None:
        """The consumer handed the record at `offset` (`size` bytes) of `tp` to Faust."""
        self._offered[tp] = offset + 1
        self.offered_bytes += size

    def took(self, records: int) -> None:
        """The worker took `records` from its stream (handled or skipped by its book)."""
        self.handled += records

    def forget(self, tps: set) -> None:
        """Partitions taken away or sought: their deliveries start afresh."""
        for tp in tps:
            self._offered.pop(tp, None)
            self._marks.pop(tp, None)

    def stuck(self, end: dict, expected: dict, now: float) -> list[tuple[Any, str]]:
        """Partitions that stopped, each with why; a partition reported is watched afresh.

        `end`: the offset the next record written will get; `expected`: the next offset to handle
        (from the book, else the commit, else the log start). Partitions left out are not watched.
        """
        for tp in set(self._marks) - set(end):
            del self._marks[tp]
        if self._totals != (self.handled, self.offered_bytes):
            self._totals, self._active = (self.handled, self.offered_bytes), now
        out = []
        for tp, last in end.items():
            why = self._why(tp, last, expected[tp], now)
            if why:
                out.append((tp, why))
                self.forget({tp})
        return out

    def _why(self, tp: Any, end: int, expected: int, now: float) -> Optional[str]:
        offered = self._offered.get(tp, expected)
        if offered > expected:  # handed over, not handled yet
            mark = self._mark(tp, "handled", expected, now)
            taken = self.handled - mark.handled
            if taken > self.in_flight:
                return (f"records from {expected} to {offered - 1} were fetched and not handled while "
                        f"{taken} records of other partitions were")
        elif end > expected:  # waiting on the broker, not fetched yet
            mark = self._mark(tp, "offered", offered, now)
            passed = self.offered_bytes - mark.offered_bytes
            if passed > self.round_bytes:
                return (f"records from {expected} to {end - 1} wait and none was fetched while "
                        f"{passed >> 20} MiB of other partitions were")
        else:
            self._marks.pop(tp, None)  # caught up
            return None
        quiet = now - max(mark.since, self._active)
        if quiet > self.idle_s:
            return (f"records from {expected} to {end - 1} waited {quiet:.0f} s "
                    f"while the worker was offered nothing and handled nothing")
        return None

    def _mark(self, tp: Any, kind: str, offset: int, now: float) -> _Mark:
        """The partition's mark, set anew whenever what it waits on moved."""
        mark = self._marks.get(tp)
        if mark is None or (mark.kind, mark.offset) != (kind, offset):
            mark = self._marks[tp] = _Mark(kind, offset, now, self.handled, self.offered_bytes)
        return mark
