"""The rollout worker's continuous-batching loop, for an engine that batches continuously.

An engine says it can (`continuous_batching = True`, rollout/engines/vllm_async.py): its `generate`
may be called from many threads at once, and their requests share its running batch. The worker
then keeps up to `rollout.max_inflight` sequences in the engine: each admitted task runs its workflow
in a thread of its own (single-turn: one group submitted, waited for; multi-turn: one call per turn),
the next task is admitted as soon as its group fits (admission and staleness rules as in the batched
path; a task's experiences count against the budget when admitted, since they will be published),
and a group is published the moment its samples are done and scored. Offsets move through the commit
book (commit_book.py): only past the contiguous prefix of tasks whose outputs are acknowledged.
Weight swaps happen between loop turns while requests are in flight (the engine's in-flight update:
abort, load, resubmit), each token keeping the version that sampled it.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

from undertow.schemas import Task
from undertow.streams import CommitRefused, Delivery

from undertow.rollout.commit_book import CommitBook

log = logging.getLogger(__name__)

COMMIT_EVERY_S = 0.5  # commits flush the producer: not after every group
METRIC_EVERY_S = 2.0  # one throughput metric per interval, not per group
KEEP_ALIVE_S = 1.0  # a full engine takes no task: the consumer still polls (idle) this often to stay in its group


@dataclass
class _Window:
    """What was published since the last metric, and how long the engine had work meanwhile."""

    started: float = field(default_factory=time.monotonic)
    experiences: list = field(default_factory=list)
    tasks: int = 0
    generate_s: float = 0.0


class ContinuousLoop:
    """Runs one worker's tasks through a continuously batching engine (see the module docstring)."""

    def __init__(self, worker, max_inflight: int):
        self.w, self.max_inflight = worker, max_inflight
        self.book = CommitBook()
        self.running: dict[Future, tuple[Delivery[Task], float]] = {}
        self.sequences = 0  # samples of the running tasks: what sits in the engine
        self.admitted = 0
        self.window = _Window()
        self.last_commit = self.last_poll = self.last_turn = time.monotonic()

    def run(self, stop: threading.Event, max_tasks: int | None, idle_timeout: float | None) -> None:
        last_work = time.monotonic()
        with ThreadPoolExecutor(max_workers=self.max_inflight, thread_name_prefix=f"{self.w.name}-task") as pool:
            while True:
                taking = not stop.is_set() and (max_tasks is None or self.admitted < max_tasks)
                if not taking and not self.running:
                    break
                self._clock()
                self.w._swap_weights()  # in flight: the engine pauses, loads, resubmits
                if taking and self._admit(pool, max_tasks):
                    last_work = time.monotonic()
                elif not self.running and idle_timeout is not None and time.monotonic() - last_work > idle_timeout:
                    break
                if self.running:
                    done, _ = wait(list(self.running), timeout=0.02, return_when=FIRST_COMPLETED)
                    self._clock()  # before publishing: a group admitted and done within this wait counts its time
                    for future in done:
                        self._publish(future)
                        last_work = time.monotonic()
                if time.monotonic() - self.last_poll > KEEP_ALIVE_S:
                    self.w.consumer.idle(0)  # paused: a live member of the group, no record taken
                    self.last_poll = time.monotonic()
                self._commit(force=not self.running)
                self._metric(force=not self.running)

    def _clock(self) -> None:
        """Count the time since the last loop turn as generating when any task was in the engine."""
        now = time.monotonic()
        if self.running:
            self.window.generate_s += now - self.last_turn
        self.last_turn = now

    def _admit(self, pool: ThreadPoolExecutor, max_tasks: int | None) -> bool:
        """Admit ready tasks while their groups fit in the engine and admission allows; True if any came."""
        came = False
        while (max_tasks is None or self.admitted < max_tasks) and self.sequences < self.max_inflight:
            if self.w.admission.reason_to_wait(time.monotonic()) is not None:
                if not self.running:
                    self.w._wait_for_trainer()  # idles the consumer, counts the wait
                break
            got = self.w.consumer.poll(timeout_ms=0 if self.running else 200, max_records=1)
            self.last_poll = time.monotonic()
            if not got:
                break
            (delivery,) = got
            n = delivery.record.group_size
            if self.running and self.sequences + n > self.max_inflight:  # does not fit yet: read it again later
                self.w.consumer.give_back([delivery])
                break
            self.book.read((delivery.topic, delivery.partition), delivery.offset)
            self.w.admission.published(n)  # counted now: a group in the engine will be published
            self.running[pool.submit(self._generate, delivery.record)] = (delivery, time.monotonic())
            self.sequences += n
            self.admitted += 1
            came = True
        return came

    def _generate(self, task: Task):
        """In a pool thread: the workflow for one task; its trajectories, or the exception it raised."""
        try:
            return self.w.workflow([task], self.w.ctx)[0]
        except Exception as e:  # the worker dead-letters it
            return e

    def _publish(self, future: Future) -> None:
        delivery, _ = self.running.pop(future)
        self.sequences -= delivery.record.group_size
        acks = []
        sent = []
        for exp in self.w._experiences(delivery, future.result()):  # dead-letters a failed task itself
            ack = self.w._publish(exp)
            if ack is not None:
                acks.append(ack)
                sent.append(exp)
        self.book.finished((delivery.topic, delivery.partition), delivery.offset, acks)
        self.window.experiences += sent
        self.window.tasks += 1
        self.w.stats.tasks += 1

    def _commit(self, force: bool) -> None:
        """Every COMMIT_EVERY_S, or `force`d when nothing runs: then the producer is flushed first, so
        the last groups' acknowledgements are in (else the loop could end with them uncommitted)."""
        if not force and time.monotonic() - self.last_commit < COMMIT_EVERY_S:
            return
        if force:
            self.w.producer.flush()
        offsets = self.book.committable()
        if offsets:
            try:
                self.w.consumer.commit(offsets)  # flushes the producer first: a lost send raises here
                self.book.committed(offsets)
            except CommitRefused:  # the next poll rejoins and reads every task in the book again
                again = self.book.pending()
                self.w.refused_commit(again)
                self.admitted -= again  # admitted again when they come back
                self.book.forget()
        self.last_commit = time.monotonic()

    def _metric(self, force: bool) -> None:
        seconds = time.monotonic() - self.window.started
        if not self.window.experiences or (not force and seconds < METRIC_EVERY_S):
            return
        self.w._account(self.window.experiences, seconds, self.window.tasks, generate_s=self.window.generate_s,
                        count_admission=False)
        self.window = _Window()
