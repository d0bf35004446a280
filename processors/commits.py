"""Re-reading a partition whose commits are stuck behind what the worker read.

Faust commits, per partition, the run of consecutive acknowledged offsets after the last commit.
Records handed to the streams around a rebalance can miss their acknowledgement; Faust then holds
the partition's commit there, or creeps past one such record per commit (its check for a missing
head is off by one). Seen in the processors-kill fault test: records around the kill that never
reached the pipeline were lost. `CommitWatch` finds a partition whose commit has not reached what
the worker read `stall_s` ago; the runner seeks it back to its committed offset, so the missing
records are read again (those after them come twice, and the dedupe stage rejects the copies).
"""

from __future__ import annotations

from typing import Any


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
