"""A mend for kafka-python 3.0.12, applied once on import: every client is opened through
`streams.connect`, which imports this module.

A consumer group's leader rejoins when the partitions it assigned change: topics grown, or a topic's
metadata that arrived only after the first join (that join assigned nothing). Nothing else asks for
that rejoin: `need_rejoin()` compares the leader's metadata with what it last assigned from. The
JoinGroup/SyncGroup round trip runs as a task that a `poll(timeout_ms=...)` awaits at most its own
timeout, leaving it in flight for the next poll. But the leader's assignment, inside that task,
records the new metadata as assigned from, so the next poll finds nothing to rejoin for, never
collects the task, and the member stays in REBALANCING with its heartbeats off and no partitions,
until the group evicts it without it noticing. Seen here as a resumed run's rollout worker that read
no task for 400 s (a short poll under a loaded CI host) and as a grown topic's partition never read.
The mend: a join that was begun is a join still needed, until a poll has collected it.
"""

from __future__ import annotations

from kafka.coordinator.consumer import ConsumerCoordinator

_need_rejoin = ConsumerCoordinator.need_rejoin


def _need_rejoin_until_collected(self: ConsumerCoordinator) -> bool:
    return getattr(self, "_join_task", None) is not None or _need_rejoin(self)


if not getattr(ConsumerCoordinator.need_rejoin, "undertow_mend", False):
    _need_rejoin_until_collected.undertow_mend = True  # type: ignore[attr-defined]
    ConsumerCoordinator.need_rejoin = _need_rejoin_until_collected  # type: ignore[method-assign]
