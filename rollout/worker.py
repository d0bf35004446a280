"""The rollout worker: tasks in, experiences out, weights swapped between generations.

An engine that batches continuously (`continuous_batching`, the vllm_async engine) gets the
continuous loop instead (continuous.py): up to `rollout.max_inflight` sequences in the engine, a
task admitted as soon as its group fits, a group published as soon as it is done, offsets committed
through a commit book, weights swapped while requests are in flight.

Otherwise, per batch of up to `rollout.batch_tasks` ready tasks: generate every group in one engine
call (a single-turn workflow; a multi-turn one plays every episode of the batch at once, one call per turn),
score each, publish one Experience per sample keyed by group id once its task's episodes have all
ended, wait for the acknowledgements, then commit the batch's offsets (at-least-once; ids are
deterministic, so a batch redelivered after a crash yields the same experiences). The workflow runs on
a thread of its own while the consumer keeps polling (taking nothing), as the continuous loop does:
a batch that outlasts max.poll.interval keeps its partitions and its commit.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as StillRunning
from dataclasses import dataclass

from undertow.kernel.models import fingerprint
from undertow.schemas import MAX_RECORD_BYTES, Experience, MetricEvent, Task, encode
from undertow.streams import CommitRefused, Delivery, RecordConsumer, RecordProducer, RunContext

from undertow.rollout.admission import Admission
from undertow.rollout.config import RolloutConfig, rollout_group
from undertow.rollout.continuous import KEEP_ALIVE_S, ContinuousLoop
from undertow.rollout.engines import build_engine
from undertow.rollout.experiences import to_experiences
from undertow.rollout.rewards import build_reward
from undertow.rollout.rewards.models import NoVerdict
from undertow.rollout.weight_subscriber import WeightSubscriber
from undertow.rollout.workflows import Outcome, WorkflowContext, build_batch_workflow

log = logging.getLogger(__name__)


@dataclass
class WorkerStats:
    """What a worker did, returned when it stops."""

    tasks: int = 0
    experiences: int = 0
    tokens: int = 0
    failed_tasks: int = 0
    weight_swaps: int = 0
    waits: int = 0
    commits_refused: int = 0  # the group had moved the tasks on: they are read again


class RolloutWorker:
    """One member of the rollout consumer group."""

    def __init__(self, cfg: RolloutConfig, run: RunContext, name: str = "rollout-0"):
        settings = run.kafka
        self.name, self.model_name = name, run.model.name
        self.topics = run.topics
        self.engine = build_engine(cfg.engine, run.model)
        reward = build_reward(cfg.reward, timeout_s=cfg.reward_timeout_s)  # a hanging one: reason timeout
        self.ctx = WorkflowContext(engine=self.engine, sampling=cfg.sampling, reward=reward,
                                   chat_template=cfg.chat_template, greedy_baseline=cfg.greedy_baseline)
        self.workflow = build_batch_workflow(cfg.workflow)
        self.batch_tasks, self.max_inflight = cfg.batch_tasks, cfg.max_inflight
        self.continuous = bool(getattr(self.engine, "continuous_batching", False))  # the engine says
        self.admission = Admission(cfg.max_staleness, cfg.experiences_per_version, cfg.cap_wait_s)
        self.wait_seconds = cfg.weights_wait_seconds
        self.producer = RecordProducer(settings)
        self.consumer: RecordConsumer[Task] = RecordConsumer(
            settings, [self.topics.tasks], group_id=rollout_group(run.namespace, cfg.consumer_group),
            expect=Task, rejected_topic=self.topics.rejected, producer=self.producer, stage="rollout",
            max_poll_records=cfg.batch_tasks)
        self.tokenizer = fingerprint(self.engine.tokenizer)
        self.subscriber = WeightSubscriber(settings, self.topics, self.model_name, self.producer,
                                           tokenizer=self.tokenizer)
        self.stats = WorkerStats()
        self._batches = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-batch")

    def run(self, *, max_tasks: int | None = None, idle_timeout: float | None = None,
            stop: threading.Event | None = None) -> WorkerStats:
        """Work until `stop` is set, `max_tasks` tasks are done, or no task came for `idle_timeout` s."""
        stop = stop or threading.Event()
        self.subscriber.start()
        # A fresh worker starts from the newest published weights, not from version 0.
        if not self.subscriber.caught_up.wait(timeout=120):
            log.warning("%s: weights topic not read to its end after 120 s; starting anyway", self.name)
        last_work = time.monotonic()
        try:
            self.subscriber.check()  # a trainer that tokenizes otherwise: refuse before generating anything
            if self.continuous:
                ContinuousLoop(self, self.max_inflight).run(stop, max_tasks, idle_timeout)
                return self.stats
            while not stop.is_set() and (max_tasks is None or self.stats.tasks < max_tasks):
                if not self._admitted(stop):
                    break
                left = self.batch_tasks if max_tasks is None else min(self.batch_tasks, max_tasks - self.stats.tasks)
                deliveries = self.consumer.poll(timeout_ms=200, max_records=left)
                # A version announced while poll() waited binds these tasks too.
                if deliveries and not self._admitted(stop):
                    break  # stopped first: the tasks stay uncommitted and come again
                if deliveries:
                    self._process(self._within_budget(deliveries))
                    last_work = time.monotonic()
                elif idle_timeout is not None and time.monotonic() - last_work > idle_timeout:
                    break
        finally:
            self.close()
        return self.stats

    def close(self) -> None:
        self.subscriber.stop()
        self.producer.flush()
        self.consumer.close()  # leaves the group; offsets were committed batch by batch
        self.producer.close()
        self._batches.shutdown(wait=False)

    def _swap_weights(self) -> None:
        """Between generations: load the newest verified version, if one arrived."""
        resumed, latest = self.subscriber.announced()
        if resumed is not None:  # the worker may not have looked while the trainer was below where it had been
            self.admission.trainer_resumed(resumed)
        self.admission.trainer_announced(latest)
        swapped = self.subscriber.swap_in(self.engine, self.admission.held)  # generation waits for this alone
        if swapped is None:
            return
        version, paused = swapped
        self.admission.weights_loaded(version)
        self.stats.weight_swaps += 1
        self.producer.send(self.topics.metrics, MetricEvent(component=self.name, step=version,
                                                            values={"weight_swap_s": paused}), key=self.name)
        log.info("%s: now generating with %s v%d (swap %.3f s)", self.name, self.model_name, version, paused)

    def _admitted(self, stop: threading.Event) -> bool:
        """Load the newest weights and wait while admission says so; False when stopped first."""
        while not stop.is_set():
            self._swap_weights()
            if not self._wait_for_trainer():
                return True
        return False

    def _wait_for_trainer(self) -> bool:
        """True (after a short pause that keeps the group membership alive) when admission says wait."""
        opened = self.admission.valve_opened
        reason = self.admission.reason_to_wait(time.monotonic())
        if self.admission.valve_opened > opened:
            log.warning("%s: no new trainer version for %.0f s while capped: publishing another %d experiences on v%d",
                        self.name, self.admission.cap_wait_s, (self.admission.max_staleness + 1)
                        * self.admission.experiences_per_version, self.admission.latest)
        if reason is None:
            return False
        self.stats.waits += 1
        self.consumer.idle(self.wait_seconds)
        return True

    def _within_budget(self, deliveries: list[Delivery[Task]]) -> list[Delivery[Task]]:
        """The first tasks of a batch that admission's budget still covers (at least one: admission let
        it start); the rest go back to the consumer, uncommitted, for the next batch."""
        room = self.admission.room()
        if room is None:
            return deliveries
        keep, planned = 1, deliveries[0].record.group_size
        while keep < len(deliveries) and planned < room:
            planned += deliveries[keep].record.group_size
            keep += 1
        if keep < len(deliveries):
            self.consumer.give_back(deliveries[keep:])
        return deliveries[:keep]

    def _process(self, deliveries: list[Delivery[Task]]) -> None:
        started = time.time()
        try:
            outcomes = self._generate([d.record for d in deliveries])  # one engine call, single-turn
        except Exception as e:  # a batched workflow that fails as a whole fails each of its tasks
            outcomes = [e] * len(deliveries)
        generated = time.time() - started
        sent = [exp for delivery, outcome in zip(deliveries, outcomes) for exp in self._experiences(delivery, outcome)
                if self._publish(exp) is not None]
        if sent:
            self._account(sent, time.time() - started, len(deliveries), generate_s=generated)
        # commit() flushes the producer first: every experience (and dead letter) of the batch is
        # acknowledged before the offsets move past its tasks.
        try:
            self.consumer.commit(next_offsets(deliveries))
        except CommitRefused:
            self.refused_commit(len(deliveries))
            return
        self.stats.tasks += len(deliveries)

    def refused_commit(self, tasks: int) -> None:
        """The group took this worker's partitions while it was away: their tasks are generated again by
        whoever reads them next (this worker, once its next poll rejoins); the experiences' ids repeat,
        so the copies already published are dropped downstream. Nothing is lost, nothing crashes."""
        self.stats.commits_refused += 1
        log.warning("%s: the group moved this worker's tasks on before it committed %d of them (a broker outage, "
                    "or no poll in time): they will be read and generated again", self.name, tasks)

    def _generate(self, tasks: list[Task]) -> list[Outcome]:
        """The workflow over a batch, on a thread of its own, while this one keeps the consumer a live
        member of its group: a batch may outlast the consumer's max.poll.interval (5 min: long
        episodes, a slow CPU), and then the group would take its tasks back and refuse the commit."""
        future = self._batches.submit(self.workflow, tasks, self.ctx)
        while True:
            try:
                return future.result(timeout=KEEP_ALIVE_S)
            except StillRunning:
                self.consumer.idle(0)  # polls (no record taken): the group sees the member alive

    def _experiences(self, delivery: Delivery[Task], outcome: Outcome) -> list[Experience]:
        """A task's experiences, or none after dead-lettering a task that failed (it does not stop the group)."""
        task = delivery.record
        try:
            if isinstance(outcome, Exception):
                raise outcome
            return to_experiences(task, outcome, policy_version=self.admission.held, worker=self.name,
                                  tokenizer=self.tokenizer)
        except Exception as e:  # a bad task or a failing plugin
            log.error("%s: task %s failed", self.name, task.task_id, exc_info=e)
            self.stats.failed_tasks += 1
            # A model reward with no verdict names why (scorer_timeout, ...): rollout/rewards/models.py.
            self.producer.reject(self.topics.rejected, stage="rollout", reason=_reason(e),
                                 detail=f"{type(e).__name__}: {e}", original=encode(task), key=delivery.key,
                                 source_topic=delivery.topic, partition=delivery.partition,
                                 offset=delivery.offset, record_id=task.task_id)
            return []

    def _publish(self, exp: Experience) -> object | None:
        """Send one experience (the future resolves when acknowledged); one larger than any reader accepts
        goes to the rejected topic instead, and None comes back (past the Kafka message limit the producer
        would raise and stop the worker on every retry)."""
        data = encode(exp)
        if len(data) > MAX_RECORD_BYTES:
            self.producer.reject(self.topics.rejected, stage="rollout", reason="too_large",
                                 detail=f"{len(data)} bytes > max_bytes {MAX_RECORD_BYTES}", original=data,
                                 key=exp.group_id.encode(), record_id=exp.experience_id)
            return None
        return self.producer.send_bytes(self.topics.raw, data, key=exp.group_id)

    def _account(self, experiences: list, seconds: float, tasks: int, *, generate_s: float,
                 count_admission: bool = True) -> None:
        """Stats and a metric for `experiences` published over `seconds`, of which the engine was busy
        `generate_s` (what the rollout side's idle fraction is made of); `count_admission`: they were
        not counted against admission's budget yet (the continuous loop counts them when admitted)."""
        tokens = sum(e.num_response_tokens for e in experiences)
        self.stats.experiences += len(experiences)
        self.stats.tokens += tokens
        if count_admission:
            self.admission.published(len(experiences))
        rewards = [e.reward for e in experiences]
        metric = MetricEvent(component=self.name, step=self.admission.held, values={
            "tokens": float(tokens), "tokens_per_s": tokens / max(seconds, 1e-9), "reward_mean": sum(rewards) / len(rewards),
            "policy_version": float(self.admission.held), "trainer_version": float(self.admission.latest),
            "batch_tasks": float(tasks), "generate_s": generate_s, **_tool_counts(experiences)})
        self.producer.send(self.topics.metrics, metric, key=self.name)


def next_offsets(deliveries: list[Delivery[Task]]) -> dict[tuple[str, int], int]:
    """What to commit after a batch: per partition, the offset after its last task."""
    offsets: dict[tuple[str, int], int] = {}
    for d in deliveries:
        offsets[(d.topic, d.partition)] = max(d.offset + 1, offsets.get((d.topic, d.partition), 0))
    return offsets


def _tool_counts(experiences: list[Experience]) -> dict[str, float]:
    """Tool calls of a batch by outcome (`tool_ok`, `tool_timeout`, ...), from the tool_agent workflow's metadata."""
    counts: dict[str, float] = {}
    for e in experiences:
        tools = e.metadata.get("tools")
        for kind, n in (tools.items() if isinstance(tools, dict) else ()):
            counts[f"tool_{kind}"] = counts.get(f"tool_{kind}", 0.0) + float(n)  # type: ignore[arg-type]
    return counts


def _reason(error: Exception) -> str:
    """The rejected record's reason for a task that failed with `error`."""
    return error.reason if isinstance(error, NoVerdict) else "workflow_error"
