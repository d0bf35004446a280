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
past it, and Faust drops what arrives behind its read position. What the book cannot see, records
Faust never hands to the streams, is the delivery watch's (streams/faust/delivery.py).
"""

from __future__ import annotations

import time
from enum import Enum
from typing import Any, AsyncIterator, Optional

from aiokafka.errors import KafkaError
from faust.transport.drivers.aiokafka import Consumer
from faust.types import TP, Message

from undertow.streams.faust.delivery import DeliveryWatch


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


def booked_consumer(books: InOrder, topic: str, watch: DeliveryWatch) -> type[Consumer]:
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


def committed(consumer: Any, tp: Any) -> Optional[int]:
    """The offset `tp` is committed to (the next to read), as Faust last committed or read it."""
    return consumer._committed_offset.get(tp)  # Faust has no public view


async def in_order(consumer: Any, books: InOrder, events: list, log: Any) -> list:
    """The events each partition's book takes; a partition that skipped records is sought back."""
    taken = []
    for event in events:
        tp = event.message.tp
        verdict = books.admit(tp, event.message.offset, committed(consumer, tp))
        if verdict is Verdict.TAKE:
            taken.append(event)
        elif verdict is Verdict.EARLY and (offset := books.rewind(tp)) is not None:
            log.warning("%s: offset %d arrived before %d; reading again from %d",
                        tp, event.message.offset, offset, offset)
            await consumer.seek(tp, offset)
    return taken


async def next_offsets(consumer: Any, books: InOrder, tps: list) -> dict:
    """The next offset to handle per partition: the book's, else the commit, else the log start."""
    out = {tp: books.expected(tp) for tp in tps}
    out.update({tp: committed(consumer, tp) for tp, o in out.items() if o is None})
    unknown = [tp for tp, o in out.items() if o is None]
    if unknown:
        out.update(await consumer.earliest_offsets(*unknown))
    return out


async def reread_stuck(app: Any, books: InOrder, topic: str, watch: DeliveryWatch, log: Any) -> None:
    """Seek each partition of `topic` that `watch` finds stuck back to the next offset to handle."""
    consumer = app.consumer
    # A rebalance, table recovery included, may keep the streams waiting as long as it needs.
    parts = [] if app.rebalancing else [tp for tp in consumer.assignment() if tp.topic == topic]
    try:
        end = await consumer.highwaters(*parts) if parts else {}
        expected = await next_offsets(consumer, books, parts)
    except KafkaError as exc:  # a broker away for a moment: look again next time
        log.info("end offsets unavailable: %r", exc)
        return
    for tp, why in watch.stuck(end, expected, time.monotonic()):
        log.warning("%s: %s; reading it again from %d", tp, why, expected[tp])
        await consumer.seek(tp, expected[tp])
