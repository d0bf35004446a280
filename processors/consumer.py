"""Commits that never pass a record the worker did not finish, and re-reading where they are stuck.

Faust commits, per partition, the run of consecutive acknowledged offsets that starts at the last
commit. Its check for a missing head is off by one: when exactly the committed offset itself was
never acknowledged, it commits the run after it anyway, one skipped record per commit. Records
handed to the streams around a rebalance can miss their acknowledgement (seen after every restart
in the processors-kill fault test: the first records after the committed offset), and Faust then
crept past them. `ContiguousCommitConsumer` waits instead; `CommitWatch` finds a partition whose
commit has not reached what the worker read for `stall_s`, and the runner seeks it back to its
committed offset, so the missing records are read again (what follows them comes twice, and the
dedupe stage rejects the second copies).
"""

from __future__ import annotations

from typing import Any, Optional

from faust.transport.drivers.aiokafka import Consumer
from faust.types import TP


class ContiguousCommitConsumer(Consumer):
    def _new_offset(self, tp: TP) -> Optional[int]:
        acked, committed = self._acked[tp], self._committed_offset[tp]
        if acked and committed is not None and min(acked) > committed:
            return None  # the next record to commit was never acknowledged: no commit past it
        return super()._new_offset(tp)


class CommitWatch:
    """Records a worker read must be committed within `stall_s`, partition by partition."""

    def __init__(self, stall_s: float):
        self.stall_s = stall_s
        self._waiting: dict[Any, tuple[int, float]] = {}  # partition -> (read offset, since when)

    def stuck(self, read: dict, committed: dict, now: float) -> list[tuple[Any, str]]:
        """Partitions whose commit has not reached a record read `stall_s` ago, each with why.

        `read`: the last offset handed to the streams; `committed`: the next offset to read, as
        committed. A partition reported is watched afresh from then on.
        """
        out = []
        for tp, offset in read.items():
            done = committed.get(tp)
            if offset is None or (done is not None and done >= offset):
                self._waiting.pop(tp, None)  # caught up (after a seek, read holds the committed offset)
                continue
            target, since = self._waiting.setdefault(tp, (offset, now))
            if done is not None and done > target:  # that one is committed: follow the newest read
                self._waiting[tp] = (offset, now)
            elif now - since > self.stall_s:
                out.append((tp, f"offset {target} was read {now - since:.0f} s ago and is not committed "
                                f"(committed up to {done})"))
                del self._waiting[tp]
        return out
