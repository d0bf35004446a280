"""Each raw record is handed to the pipeline once and in offset order, commits never pass one that
was not published, and a partition that skipped records is read again from the first one missing;
a partition whose commit stands still while records wait is found (the backstop)."""

from __future__ import annotations

import asyncio

from faust.transport.drivers.aiokafka import Consumer

from processors.commits import CommitWatch, InOrder, Verdict, booked_consumer


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
        self.offset = offset


def test_the_consumer_delivers_nothing_of_a_partition_after_a_seek_until_the_offset_sought():
    """Records fetched before a seek would move Faust's read position past the offset sought, and
    Faust drops what arrives behind its read position: the offset sought would never arrive."""
    fetched = [("p0", Msg(o)) for o in (20, 21, 22)] + [("p1", Msg(5))] + [("p0", Msg(o)) for o in (10, 11)]

    class Fetcher(Consumer):
        def __init__(self) -> None:  # only the offset books, no broker
            self._read_offset, self._committed_offset = {"p0": 23}, {}

        async def seek(self, partition, offset) -> None:
            self._read_offset[partition] = offset

        async def getmany(self, timeout):
            for tp, message in fetched:
                yield tp, message

    consumer = type("Booked", (booked_consumer(InOrder(), "raw"), Fetcher), {})()

    async def read() -> list:
        await consumer.seek("p0", 10)
        consumer._read_offset["p0"] = 22  # a record fetched before the seek moved it on
        return [(tp, m.offset) for tp, m in [pair async for pair in consumer.getmany(1.0)]]

    assert asyncio.run(read()) == [("p1", 5), ("p0", 10), ("p0", 11)]
    assert consumer._read_offset["p0"] == 10  # so Faust's check lets 10 through


def test_commit_watch_names_a_partition_whose_commit_stands_still_with_records_waiting():
    watch = CommitWatch(stall_s=10)
    assert watch.stuck({"p0": 9, "p1": 3}, {"p0": 5, "p1": None}, now=0.0) == []
    assert watch.stuck({"p0": 12, "p1": 3}, {"p0": 7}, now=8.0) == []        # p0's commit moved: watched afresh
    (tp, why), = watch.stuck({"p0": 12, "p1": 3}, {"p0": 7}, now=10.5)       # p1: nothing committed for 10 s
    assert tp == "p1" and why.startswith("the commit stayed at None for 10 s while records up to 2 waited")
    assert watch.stuck({"p0": 12, "p1": 3}, {"p0": 7}, now=17.0) == []       # p1 reported once, then watched afresh
    (tp, why), = watch.stuck({"p0": 12, "p1": 3}, {"p0": 7}, now=18.5)
    assert tp == "p0" and "stayed at 7" in why


def test_commit_watch_is_quiet_for_a_caught_up_or_unwatched_partition():
    watch = CommitWatch(stall_s=10)
    assert watch.stuck({"p0": 42, "p1": 0}, {"p0": 42, "p1": None}, now=0.0) == []  # nothing waits
    assert watch.stuck({"p0": 42, "p1": 0}, {"p0": 42, "p1": None}, now=100.0) == []
    assert watch.stuck({"p0": 50}, {"p0": 42}, now=100.0) == []
    assert watch.stuck({}, {}, now=105.0) == []                                      # rebalancing: not watched
    assert watch.stuck({"p0": 50}, {"p0": 42}, now=111.0) == []                      # watched afresh from 111
    assert [tp for tp, _ in watch.stuck({"p0": 50}, {"p0": 42}, now=121.5)] == ["p0"]
