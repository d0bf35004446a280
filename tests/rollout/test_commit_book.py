"""The commit book (rollout/commit_book.py): offsets move only past the contiguous prefix of settled tasks."""

from __future__ import annotations

from dataclasses import dataclass

from undertow.rollout.commit_book import CommitBook

P0, P1 = ("tasks", 0), ("tasks", 1)


@dataclass
class Ack:
    """What the book reads of a send future: whether the brokers answered."""

    is_done: bool = False


def test_a_task_finished_out_of_order_waits_for_the_ones_before_it():
    book = CommitBook()
    for offset in (10, 11, 12):
        book.read(P0, offset)
    book.finished(P0, 12, [Ack(True), Ack(True)])  # the short group, read last, done first
    assert book.committable() == {}  # 10 and 11 are still generating
    book.finished(P0, 10, [Ack(True)])
    assert book.committable() == {P0: 11}  # 10 is settled; 11 still blocks 12
    book.committed({P0: 11})
    assert book.pending() == 2
    book.finished(P0, 11, [Ack(True)])
    assert book.committable() == {P0: 13}
    book.committed({P0: 13})
    assert book.pending() == 0 and book.committable() == {}


def test_nothing_is_committed_before_its_experiences_are_acknowledged():
    book = CommitBook()
    book.read(P0, 0)
    pending = Ack(False)
    book.finished(P0, 0, [Ack(True), pending])
    assert book.committable() == {}
    pending.is_done = True
    assert book.committable() == {P0: 1}


def test_partitions_are_independent_and_a_dead_lettered_task_settles_without_acks():
    book = CommitBook()
    book.read(P0, 5)
    book.read(P1, 7)
    book.read(P1, 8)
    book.finished(P1, 8, [])  # its task failed and was dead-lettered: nothing of its own to wait for
    assert book.committable() == {}  # P1's 7 is not done; P0's 5 neither
    book.finished(P0, 5, [Ack(True)])
    assert book.committable() == {P0: 6}
    book.finished(P1, 7, [Ack(True)])
    assert book.committable() == {P0: 6, P1: 9}


def test_offsets_between_tasks_need_no_entry():
    # The consumer dead-letters an undecodable record itself (offset 21): the next task is 22, and
    # committing past 22 covers 21 too.
    book = CommitBook()
    book.read(P0, 20)
    book.read(P0, 22)
    book.finished(P0, 22, [Ack(True)])
    book.finished(P0, 20, [Ack(True)])
    assert book.committable() == {P0: 23}


def test_a_lost_partition_leaves_the_book():
    book = CommitBook()
    book.read(P0, 1)
    book.read(P1, 1)
    book.forget([P0])
    book.finished(P1, 1, [])
    assert book.committable() == {P1: 2} and book.pending() == 1


def test_a_task_finishing_after_its_partition_was_forgotten_is_not_booked():
    """A refused commit forgets the book; a task in flight then finishes: it leaves no entry, and the
    same offset read again (the partition's tasks come again) waits for its own finish."""
    book = CommitBook()
    book.read(P0, 5)
    book.forget()
    book.finished(P0, 5, [Ack(True)])
    assert book.pending() == 0 and book.committable() == {}
    book.read(P0, 5)
    assert book.committable() == {}
    book.finished(P0, 5, [Ack(True)])
    assert book.committable() == {P0: 6}
