"""The delivery watch: partitions a Faust worker no longer serves, told apart from partitions that wait.

The backstop for what a worker's in-order book (streams/faust/books.py) cannot see: records Faust
never hands to the streams (seen once in ~30 restarts: a record fetched while a new worker seeks to
its commits, then nothing). It judges a partition by what the consumer offered and the worker took,
not by its commit: a partition whose commit stands still because a backlog of other partitions is
drained first is waiting its turn, not lost (at 69a877d such a partition made the worker exit).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


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
