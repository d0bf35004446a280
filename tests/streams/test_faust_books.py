"""Each raw record is handed to the pipeline once and in offset order, commits never pass one that
was not published, and a partition that skipped records is read again from the first one missing;
a partition the worker no longer serves is found (the backstop), and one that waits its turn is not."""

from __future__ import annotations

import asyncio

from faust.transport.drivers.aiokafka import Consumer
from faust.types import TP

from undertow.streams.faust import DeliveryWatch, InOrder, Verdict, booked_consumer


def test_records_are_taken_in_order_from_the_committed_offset():
    books = InOrder()
    assert books.admit("p0", 40, committed=42) is Verdict.HANDLED   # below the commit: done before
    assert books.admit("p0", 42, committed=42) is Verdict.TAKE
    assert books.admit("p0", 42, committed=42) is Verdict.HANDLED   # delivered twice
    assert books.admit("p0", 45, committed=42) is Verdict.EARLY     # 43 and 44 never arrived
    assert books.admit("p1", 7, committed=None) is Verdict.TAKE     # no commit yet: starts where it starts


def test_a_partition_that_skipped_records_is_sought_back_once_until_they_arrive():
    books = InOrder()
    books.admit("p0", 10, committed=10)
    assert books.admit("p0", 30, committed=10) is Verdict.EARLY
    assert books.rewind("p0") == 11
    assert books.admit("p0", 31, committed=10) is Verdict.EARLY
    assert books.rewind("p0") is None                               # that seek is pending
    assert books.admit("p0", 11, committed=10) is Verdict.TAKE
    books.admit("p0", 13, committed=10)
    assert books.rewind("p0") == 12                                 # a new hole: a new seek


def test_commits_reach_only_what_was_published():
    books = InOrder()
    for offset in (5, 6, 7):
        books.admit("p0", offset, committed=5)
    assert books.committable("p0", committed=5) is None             # taken, not yet acknowledged
    books.published()
    assert books.committable("p0", committed=5) == 8
    books.admit("p0", 8, committed=8)
    assert books.committable("p0", committed=8) is None             # 8 is not published
    books.forget({"p0"})
    assert books.committable("p0", committed=8) is None
    assert books.admit("p0", 9, committed=8) is Verdict.EARLY       # a new assignment starts at its commit


class Msg:
    def __init__(self, offset: int):
        self.offset, self.value = offset, b"x" * 10


def test_the_consumer_delivers_nothing_of_a_partition_after_a_seek_until_the_offset_sought():
    """Records fetched before a seek would move Faust's read position past the offset sought, and
    Faust drops what arrives behind its read position: the offset sought would never arrive."""
    p0, p1 = TP("raw", 0), TP("raw", 1)
    fetched = [(p0, Msg(o)) for o in (20, 21, 22)] + [(p1, Msg(5))] + [(p0, Msg(o)) for o in (10, 11)]

    class Fetcher(Consumer):
        def __init__(self) -> None:  # only the offset books, no broker
            self._read_offset, self._committed_offset = {p0: 23}, {}

        async def seek(self, partition, offset) -> None:
            self._read_offset[partition] = offset

        async def getmany(self, timeout):
            for tp, message in fetched:
                yield tp, message

    watch = DeliveryWatch(idle_s=10, in_flight=100, round_bytes=1000)
    consumer = type("Booked", (booked_consumer(InOrder(), "raw", watch), Fetcher), {})()

    async def read() -> list:
        await consumer.seek(p0, 10)
        consumer._read_offset[p0] = 22  # a record fetched before the seek moved it on
        return [(tp.partition, m.offset) for tp, m in [pair async for pair in consumer.getmany(1.0)]]

    assert asyncio.run(read()) == [(1, 5), (0, 10), (0, 11)]
    assert consumer._read_offset[p0] == 10  # so Faust's check lets 10 through
    assert watch.offered_bytes == 30  # what was handed on is what the watch saw offered


def test_a_partition_waiting_its_turn_is_never_stuck_however_long_it_takes():
    """The issue-21 case: a partition's commit stands still for minutes while its records wait,
    fetched behind a backlog of another partition (a slow pipeline: 10 records/s)."""
    watch = DeliveryWatch(idle_s=15, in_flight=8704, round_bytes=20 << 20)
    for offset in range(4000):
        watch.offer("p0", offset, 1000)
    for offset in range(1000):
        watch.offer("p1", offset, 1000)           # fetched, queued behind p0's 4000
    for second in range(0, 400, 5):
        watch.took(50)
        assert watch.stuck({"p0": 10**6, "p1": 25_000, "p2": 7_000},
                           {"p0": second * 10 + 50, "p1": 0, "p2": 0}, now=second) == []
        watch.offer("p0", 4000 + second, 1000)     # p2 waits its turn: the others got < round_bytes


def test_records_fetched_and_not_handled_are_found_once_the_worker_took_more_than_it_buffers():
    watch = DeliveryWatch(idle_s=15, in_flight=100, round_bytes=10**9)
    for offset in range(40, 50):
        watch.offer("p0", offset, 1000)                                  # 40..49 handed to Faust
    watch.took(100)                                                     # ...and never reached the book
    assert watch.stuck({"p0": 50}, {"p0": 40}, now=0.0) == []          # marked: 40 must move
    watch.took(100)
    assert watch.stuck({"p0": 50}, {"p0": 40}, now=1.0) == []          # 100 taken since: could still be queued
    watch.took(1)
    (tp, why), = watch.stuck({"p0": 50}, {"p0": 40}, now=2.0)
    assert tp == "p0" and why == "records from 40 to 49 were fetched and not handled while 101 records of other partitions were"
    assert watch.stuck({"p0": 50}, {"p0": 40}, now=3.0) == []          # reported once, then watched afresh


def test_a_partition_handled_in_step_is_never_stuck():
    watch = DeliveryWatch(idle_s=15, in_flight=100, round_bytes=10**9)
    for step in range(20):
        for offset in range(step * 50, step * 50 + 50):
            watch.offer("p0", offset, 1000)
        watch.took(500)
        assert watch.stuck({"p0": 10**6}, {"p0": step * 50 + 25}, now=step) == []  # half the fetched records handled


def test_a_partition_never_fetched_is_found_after_several_fetch_rounds_of_the_others():
    watch = DeliveryWatch(idle_s=15, in_flight=100, round_bytes=4 << 20)
    assert watch.stuck({"p0": 10, "p1": 500}, {"p0": 10, "p1": 0}, now=0.0) == []
    for offset in range(4 << 10):
        watch.offer("p0", offset, 1024)                                   # 4 MiB of p0, nothing of p1
    watch.took(4 << 10)
    assert watch.stuck({"p0": 4 << 10, "p1": 500}, {"p0": 4 << 10, "p1": 0}, now=1.0) == []
    watch.offer("p0", 4 << 10, 1024)
    (tp, why), = watch.stuck({"p0": 4 << 10, "p1": 500}, {"p0": (4 << 10) + 1, "p1": 0}, now=2.0)
    assert tp == "p1" and why == "records from 0 to 499 wait and none was fetched while 4 MiB of other partitions were"


def test_a_partition_waiting_on_an_idle_worker_is_found_after_idle_s():
    """The restarted worker that never got a record of a partition it owns (no commit, no book)."""
    watch = DeliveryWatch(idle_s=15, in_flight=100, round_bytes=10**9)
    assert watch.stuck({"p1": 3}, {"p1": 0}, now=0.0) == []
    assert watch.stuck({"p1": 3}, {"p1": 0}, now=15.0) == []
    (tp, why), = watch.stuck({"p1": 3}, {"p1": 0}, now=15.5)
    assert why == "records from 0 to 2 waited 16 s while the worker was offered nothing and handled nothing"
    watch.took(1)                                       # a worker that handles anything is not idle
    assert watch.stuck({"p1": 3}, {"p1": 0}, now=20.0) == []
    watch.took(1)
    assert watch.stuck({"p1": 3}, {"p1": 0}, now=40.0) == []


def test_a_caught_up_sought_or_unwatched_partition_is_quiet():
    watch = DeliveryWatch(idle_s=10, in_flight=100, round_bytes=10**9)
    assert watch.stuck({"p0": 42}, {"p0": 42}, now=0.0) == []           # nothing waits
    assert watch.stuck({"p0": 42}, {"p0": 42}, now=100.0) == []
    assert watch.stuck({"p0": 50}, {"p0": 42}, now=100.0) == []
    assert watch.stuck({}, {}, now=105.0) == []                         # rebalancing: not watched
    assert watch.stuck({"p0": 50}, {"p0": 42}, now=111.0) == []         # watched afresh from 111
    watch.forget({"p0"})                                                # sought: afresh again
    assert watch.stuck({"p0": 50}, {"p0": 42}, now=121.5) == []
    assert [tp for tp, _ in watch.stuck({"p0": 50}, {"p0": 42}, now=131.6)] == ["p0"]
