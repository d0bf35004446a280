"""`undertow train`: the training loop. Rank 0 reads Kafka and decides; every rank trains its shard.

Per step: rank 0 forms a batch (whole groups), broadcasts it, every rank backpropagates its shard,
DeepSpeed averages gradients and steps. Then, as rank 0 decided: publish weights (every sync_every
steps), checkpoint (every checkpoint_every steps) and, only after the checkpoint is on disk, commit
offsets to Kafka. On SIGTERM/SIGINT or a budget: publish, checkpoint and commit once more, then stop.
"""

from __future__ import annotations

import logging
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from undertow.kernel.models import ModelSpec, build_tokenizer, fingerprint
from undertow.schemas import Experience, MetricEvent
from undertow.streams import KafkaSettings, RecordProducer, RunContext, Topics
from undertow.streams.weights import Sending, build_sender

from .checkpoint import Ledger, PartitionOffset, TrainerState, load_checkpoint, save_checkpoint
from .config import BatchingConfig, TrainerConfig
from .critic import build_critic
from .engine import (Process, build_training_engine, build_reference, collective_failed, gathered_weights,
                     setup_process)
from .ready_intake import ReadyIntake
from .objectives.chord import ChordObjective, as_expert
from .objectives import Objective, objectives
from .relay import Command, broadcast
from .groups import Item, record_id
from .step import TrainStepResult, StepShape, train_step

COMPONENT = "trainer"
MAX_FAILED_STEPS = 3  # batches in a row whose step raised before the trainer stops: then it is not the data
log = logging.getLogger(__name__)


@dataclass
class Budget:
    """When to stop besides a signal: after `max_steps`, or after `idle_timeout_s` without data."""

    max_steps: int | None = None
    idle_timeout_s: float | None = None


@dataclass
class StopFlag:
    """Set by SIGTERM / SIGINT; the loop finishes its step, then shuts down cleanly."""

    requested: bool = False
    signals: list[int] = field(default_factory=list)

    def install(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        self.requested = True
        self.signals.append(signum)


class Leader:
    """Rank 0's duties: the ready topic's intake, the producer, metrics, weight publishing and offset commits."""

    def __init__(self, spec: ModelSpec, cfg: TrainerConfig, kafka: KafkaSettings, topics: Topics,
                 state: TrainerState, objective: Objective, root: Path, tokenizer: str | None = None,
                 vocab_size: int | None = None, heartbeat_s: float | None = None):
        self.spec, self.cfg, self.topics, self.state = spec, cfg, topics, state
        # The other ranks wait for the next command inside a collective, which times out: while no data
        # comes, an empty command every `heartbeat_s` tells them to wait on.
        self.heartbeat_s = heartbeat_s
        self.producer = RecordProducer(kafka)
        self.sender = build_sender(Sending(spec.name, cfg.weights, self.producer, topics,
                                           "adapter" if cfg.lora else "full", kafka, tokenizer))
        # A shadow has a consumer group of its own and trains on every experience the run's trainer reads,
        # stale for it or not: it compares algorithms on the stream, its versions steer no rollout.
        shadow = topics.shadow is not None
        self.intake = ReadyIntake(kafka, topics, cfg.batching,
                         group_id=f"{cfg.consumer_group}.shadow-{topics.shadow}" if shadow else cfg.consumer_group,
                         record_type=objective.record_type, checks_staleness=objective.checks_staleness and not shadow,
                         producer=self.producer, start=state.offset_map(), trained_ids=state.trained_ids,
                         seed=cfg.engine.seed, tokenizer=tokenizer, vocab_size=vocab_size,
                         replay=cfg.replay, replay_saved=state.replay)
        # CHORD's demonstrations: a second intake on the expert topic, in the same group and checkpoint.
        self.expert = None if cfg.mixing is None else ReadyIntake(
            kafka, topics, BatchingConfig(experiences=cfg.mixing.expert_per_step, max_wait_s=0.0),
            group_id=self.intake.consumer_group, record_type=Experience, checks_staleness=False,
            producer=self.producer, start=state.offset_map(), trained_ids=state.trained_ids,
            seed=cfg.engine.seed, tokenizer=tokenizer, topic=topics.expert, vocab_size=vocab_size)
        self.ledger = Ledger(root)
        self.ledger.rewind(state.step)
        self.wait_s = 0.0
        # Between two steps' metrics, outside step_s and wait_s: the last publish and checkpoint.
        self.publish_s = self.checkpoint_s = 0.0
        self.last_data = self.last_batch = time.monotonic()
        self.pending: list = []  # the items of the batch being trained on

    def next_command(self, stop: StopFlag, budget: Budget) -> Command:
        """Block until a batch is ready, a stop is due or `heartbeat_s` passed (an empty command); say whether
        to publish / checkpoint after it."""
        step = self.state.step
        entered = time.monotonic()
        while not stop.requested and (budget.max_steps is None or step < budget.max_steps):
            started = time.monotonic()
            if self.intake.fill(step, self.cfg.poll_timeout_ms):
                self.last_data = time.monotonic()
            batch = self.intake.next_batch(step, self.cfg.batching.max_wait_s)
            self.wait_s += time.monotonic() - started
            if batch:
                # Replayed records go last, after the demonstrations: the order of the ledger's ids + reused,
                # which a retrain follows.
                fresh = [i for i in batch if i.record_id not in self.intake.replayed]
                reused = [i for i in batch if i.record_id in self.intake.replayed]
                demonstrations = self._demonstrations(step)
                self.pending = fresh + demonstrations + reused
                self.last_batch = time.monotonic()
                after = step + 1
                return Command([i.record for i in fresh] + [as_expert(i.record) for i in demonstrations] +
                               [i.record for i in reused],
                               publish=after % self.cfg.sync_every == 0,
                               checkpoint=after % self.cfg.checkpoint_every == 0)
            if budget.idle_timeout_s is not None and time.monotonic() - self.last_data >= budget.idle_timeout_s:
                break
            if self._idle_with_uncommitted_records():
                self.last_batch = time.monotonic()
                self.pending = []
                return Command([], checkpoint=True)
            if self.heartbeat_s is not None and time.monotonic() - entered >= self.heartbeat_s:
                return Command()
        self.pending = []
        return Command([], publish=self.state.published_version != step, checkpoint=True, stop=True)

    def _idle_with_uncommitted_records(self) -> bool:
        """No batch for `idle_checkpoint_s`, and records handled since the last commit: a checkpoint of the
        step (the same one again, if it was checkpointed) lets them be committed. Otherwise records all
        rejected as stale, or steps short of the next `checkpoint_every`, stay uncommitted while the
        trainer waits, and its group's lag, which a drain and an autoscaler read, never falls."""
        idle_s = self.cfg.idle_checkpoint_s
        return (idle_s is not None and time.monotonic() - self.last_batch >= idle_s
                and any(intake.moved() for intake in self.intakes()))

    def _demonstrations(self, step: int) -> list[Item]:
        """Up to `mixing.expert_per_step` demonstrations for the step, what the expert topic has now."""
        if self.expert is None:
            return []
        if len(self.expert.window) < self.expert.cfg.experiences:
            self.expert.fill(step, self.cfg.poll_timeout_ms)
        return self.expert.next_batch(step, 0.0) or []

    def intakes(self) -> list[ReadyIntake]:
        return [self.intake] + ([self.expert] if self.expert is not None else [])

    def after_step(self, result: TrainStepResult) -> None:
        """Book the step that just ran (`state.step` already counts it when it changed the weights)."""
        untrained = {record_id(r) for r in result.untrained}
        step = self.state.step
        trained: list[Item] = []
        for intake in self.intakes():
            mine = [i for i in self.pending if i.partition[0] == intake.topic]
            refused = [i for i in mine if i.record_id in untrained]
            if refused and result.failure:
                intake.refused(refused, "forward_failed", result.failure)
            elif refused:
                intake.refused(refused, "non_finite", "no update of the step had a finite loss and gradient")
            items = [i for i in mine if i.record_id not in untrained]
            intake.trained_on(items, step)
            trained += items
        if trained:  # a reuse is booked apart: the ids are each record's one first training
            again = self.intake.replayed
            self.ledger.append(step, [i.record_id for i in trained if i.record_id not in again],
                               [i.record_id for i in trained if i.record_id in again])
        # A skipped (non-finite) update's loss is inf or NaN: metric events carry finite numbers only,
        # and `skipped_updates` already says what happened.
        usual = [i for i in trained if i.partition[0] == self.intake.topic]
        values = {**result.metrics, **self.intake.step_metrics(usual, step), "wait_s": self.wait_s,
                  "publish_s": self.publish_s, "checkpoint_s": self.checkpoint_s, "version": float(step)}
        if self.expert is not None:
            values["expert_records"] = float(len(trained) - len(usual))
        values = {k: v for k, v in values.items() if math.isfinite(v)}
        component = self.topics.component(COMPONENT)
        self.producer.send(self.topics.metrics, MetricEvent(component=component, values=values, step=step),
                           key=component)
        self.wait_s = self.publish_s = self.checkpoint_s = 0.0

    def publish(self, packed: Any) -> None:
        self.sender.publish(self.state.step, packed)
        self.state.published_version = self.state.step

    def snapshot(self) -> TrainerState:
        """The state a checkpoint of the current step records (offsets safe to resume from)."""
        points = [intake.resume_point() for intake in self.intakes()]
        self.state.offsets = [PartitionOffset(topic=t, partition=p, offset=o)
                              for point in points for (t, p), o in point.offsets.items()]
        self.state.trained_ids = [i for point in points for i in point.trained_ids]
        self.state.replay = self.intake.replay.saved() if self.intake.replay is not None else []
        return self.state

    def commit(self) -> None:
        for intake in self.intakes():
            intake.commit()

    def close(self) -> None:
        self.sender.close()  # the last version is out before the producer goes
        for intake in self.intakes():
            intake.close()
        self.producer.flush()
        self.producer.close()


def build_parts(cfg: TrainerConfig, spec: ModelSpec) -> tuple[Process, Objective, Any, Any, Any]:
    """What trains: this rank's process, the objective, the DeepSpeed engine, the reference model
    (None unless the objective needs one) and PPO's critic (None: critic-free)."""
    process = setup_process(cfg.engine.master_port, cfg.engine.collective_timeout_s)
    objective = objectives.get(cfg.algorithm.objective)(cfg.algorithm)
    if cfg.mixing is not None:
        objective = ChordObjective(objective, cfg.mixing, cfg.algorithm.temperature)
    engine = build_training_engine(spec, cfg.engine, process, gradient_checkpointing=cfg.gradient_checkpointing,
                                   lora=cfg.lora)
    ref_model = build_reference(spec, process, engine) if objective.needs_reference else None
    return process, objective, engine, ref_model, build_critic(spec, cfg, process)


def run(cfg: TrainerConfig, context: RunContext, budget: Budget, stop: StopFlag | None = None) -> TrainerState:
    """Train the `trainer:` section `cfg` in `context` until a signal or the budget; returns the final
    state (on every rank)."""
    spec, kafka, topics = context.model, context.kafka, context.topics
    stop = stop or StopFlag()
    stop.install()
    process, objective, engine, ref_model, critic = build_parts(cfg, spec)
    root = Path(cfg.checkpoint_dir).expanduser() / topics.owner
    root.mkdir(parents=True, exist_ok=True)
    state = load_checkpoint(engine, root, critic.model if critic else None,
                            leader=process.is_leader) or TrainerState()
    tokenizer = build_tokenizer(spec)
    vocab_size = engine.module.get_input_embeddings().num_embeddings  # the ids the embedding can look up
    heartbeat_s = cfg.engine.collective_timeout_s / 4 if process.world_size > 1 else None
    leader = (Leader(spec, cfg, kafka, topics, state, objective, root, fingerprint(tokenizer), vocab_size,
                     heartbeat_s) if process.is_leader else None)
    try:
        _loop(engine, objective, ref_model, cfg, process, state, leader, root, stop, budget,
              pad_id=tokenizer.pad_token_id, critic=critic)
    finally:
        if leader:
            leader.close()
    return state


def _loop(engine: Any, objective: Objective, ref_model: Any, cfg: TrainerConfig, process: Process, state: TrainerState,
          leader: Leader | None, root: Path, stop: StopFlag, budget: Budget, pad_id: int, critic: Any = None) -> None:
    shape = StepShape(cfg.micro_batch_tokens, cfg.mini_batches, cfg.ppo_epochs, cfg.batching.pad_to_multiple)
    failures = 0  # batches in a row whose step raised
    if state.step > 0:
        # Resumed: announce the restored version first, so that workers holding weights from steps
        # this trainer lost (it died after its checkpoint) follow it back.
        _publish(engine, leader)
    while True:
        command = broadcast(leader.next_command(stop, budget) if leader else None,
                            leader=process.is_leader, world_size=process.world_size)
        if command.records:
            if hasattr(objective, "begin_step"):  # a schedule over steps (CHORD's μ), the same on every rank
                objective.begin_step(state.step)
            result = _guarded_step(engine, objective, command.records, ref_model, process, pad_id, shape, critic,
                                   failures)
            failures = failures + 1 if result.failure else 0
            if result.metrics["updates"]:  # a step none of whose updates applied leaves the version
                state.step += 1
            if leader:
                leader.after_step(result)
        started = time.monotonic()
        if command.publish:
            _publish(engine, leader)
        published = time.monotonic()
        if command.checkpoint:
            snapshot = leader.snapshot() if leader else state
            save_checkpoint(engine, root, snapshot, leader=process.is_leader, keep=cfg.keep_checkpoints,
                            critic=critic.model if critic else None)
            if leader:
                leader.commit()
        if leader:  # reported with the next step's metrics
            leader.publish_s += published - started
            leader.checkpoint_s += time.monotonic() - published
        if command.stop:
            return


def _guarded_step(engine: Any, objective: Objective, records: list, ref_model: Any, process: Process, pad_id: int,
                  shape: StepShape, critic: Any, failures: int) -> TrainStepResult:
    """train_step, but a batch whose step raises is dead-lettered (to the rejected topic, reason
    forward_failed) instead of killing the trainer, which would meet the same batch after every
    restart. The prepare pass runs the forward over every record before any update, so a record the
    model cannot take fails there, with the weights untouched. Several batches in a row failing is
    not the data: the trainer stops. Nor is a collective that failed (a rank cut off or gone): that
    raises, and the trainer restarts from its checkpoint with the batch unbooked. (Each rank decides
    alone: a failure on one rank of several leaves the others in a collective until its timeout.)"""
    try:
        return train_step(engine, objective, records, ref_model, process, pad_id=pad_id, shape=shape, critic=critic)
    except Exception as e:
        if collective_failed(e):
            raise
        if failures + 1 >= MAX_FAILED_STEPS:
            raise RuntimeError(f"{MAX_FAILED_STEPS} batches in a row failed their step; the last: "
                               f"{type(e).__name__}: {e}") from e
        log.exception("a batch of %d records failed its step: dead-lettered", len(records))
        for model in (engine, critic.model if critic is not None else None):
            if model is not None:
                model.zero_grad()  # whatever the failed pass accumulated
        return TrainStepResult({"updates": 0.0, "failed_steps": 1.0}, list(records),
                               failure=f"{type(e).__name__}: {str(e)[:500]}")


def _publish(engine: Any, leader: Leader | None) -> None:
    """Every rank gathers (ZeRO-3 holds slices); rank 0 packs and publishes the current version."""
    packed = gathered_weights(engine, leader.sender.pack if leader else None)
    if leader:
        leader.publish(packed)

