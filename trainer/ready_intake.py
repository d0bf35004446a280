"""The trainer's Kafka side (rank 0): read `experiences.ready`, admit, assemble groups, hand out
batches, commit, and keep the books of it: what a step's metrics say about its records, and where a
checkpoint resumes. The pure parts are in groups.py and window.py.

Partitions are assigned manually (the trainer is one logical consumer) and start at the
checkpoint's offsets, else the group's committed ones, else the beginning.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from undertow.schemas import Experience, Record, encode
from undertow.streams import KafkaSettings, RecordConsumer, RecordProducer, Topics

from .config import BatchingConfig
from .groups import (GroupAssembler, Item, OffsetTracker, Partition, TrainedIds, batch_metrics, check_experience,
                     check_tokenizer, check_vocabulary)
from .window import Window

STAGE = "trainer"


@dataclass
class IntakeCounts:
    """What happened to delivered records since the last step."""

    rejected: int = 0
    stale: int = 0
    duplicates: int = 0


@dataclass
class ResumePoint:
    """What a checkpoint keeps of the intake: per partition the offset safe to resume from, and the
    ids trained lately (oldest first), which a redelivery must not train again."""

    offsets: dict[Partition, int]
    trained_ids: list[str]


class ReadyIntake:
    """Rank 0's reader of the ready topic (or of `topic`): batches of whole groups, offsets committed
    only behind what was trained or refused."""

    def __init__(self, settings: KafkaSettings, topics: Topics, cfg: BatchingConfig, *, group_id: str,
                 record_type: type[Record], checks_staleness: bool, producer: RecordProducer,
                 start: dict[tuple[str, int], int], trained_ids: list[str], seed: int = 0,
                 tokenizer: str | None = None, topic: str | None = None, vocab_size: int | None = None):
        self.cfg, self.topics, self.producer, self.consumer_group = cfg, topics, producer, group_id
        self.checks_staleness, self.tokenizer, self.vocab_size = checks_staleness, tokenizer, vocab_size
        self.consumer = RecordConsumer(settings, [], group_id=group_id, expect=record_type,
                                       rejected_topic=topics.rejected, producer=producer, stage=STAGE)
        self.trained = TrainedIds(cfg.max_trained_ids, trained_ids)
        self.assembler = GroupAssembler(cfg.group_timeout_s)
        self.window = Window(cfg.window_groups, cfg.prioritized, seed)
        self.counts = IntakeCounts()
        # The checkpoint's offsets, else the group's committed ones, else the beginning.
        self.topic = topic or topics.ready  # another: the expert demonstrations mixed into RL steps
        self.offsets = OffsetTracker(self.consumer.assign(self.topic, start))
        self.last_arrival = time.monotonic()

    def fill(self, version: int, timeout_ms: int) -> int:
        """Poll once (unless the window is full) and admit what came; returns records delivered."""
        now = time.monotonic()
        for group in self.assembler.expired(now):
            self.window.put(group)
        if self.window.full:
            time.sleep(timeout_ms / 1000)
            return 0
        deliveries = self.consumer.poll(timeout_ms=timeout_ms)
        for d in deliveries:
            self._admit(Item(d.record, (d.topic, d.partition), d.offset), version, now)
        if deliveries:
            self.last_arrival = now
        return len(deliveries)

    def _admit(self, item: Item, version: int, now: float) -> None:
        rid = item.record_id
        if rid in self.trained or rid in self.window or self.assembler.duplicate_of_open(item):
            self.counts.duplicates += 1
            self.offsets.seen(item.partition, item.offset, held=False)
            return
        verdict = check_vocabulary(item.record, self.vocab_size)
        if not verdict.reason and isinstance(item.record, Experience):
            verdict = check_tokenizer(item.record, self.tokenizer)
            if not verdict.reason and self.checks_staleness:
                verdict = check_experience(item.record, version, self.cfg.max_staleness)
        if verdict.reason:
            self.offsets.seen(item.partition, item.offset, held=False)
            self._reject(item, verdict.reason, verdict.detail)
            return
        self.offsets.seen(item.partition, item.offset, held=True)
        group = self.assembler.add(item, now)
        if group is not None:
            self.window.put(group)

    def _reject(self, item: Item, reason: str, detail: str) -> None:
        self.counts.rejected += 1
        self.counts.stale += reason == "stale"
        topic, partition = item.partition
        self.producer.reject(self.topics.rejected, stage=STAGE, reason=reason, detail=detail,
                             original=encode(item.record), key=item.record_id.encode(), source_topic=topic,
                             partition=partition, offset=item.offset, record_id=item.record_id)

    def drop_stale(self, version: int) -> None:
        """Groups that aged past max_staleness while waiting in the window go to the rejected topic."""
        if not self.checks_staleness:
            return
        too_old = lambda g: any(version - i.record.policy_version > self.cfg.max_staleness for i in g.items)
        for group in self.window.remove(lambda g: not too_old(g)):
            for item in group.items:
                verdict = check_experience(item.record, version, self.cfg.max_staleness)
                self._reject(item, verdict.reason or "stale", verdict.detail or "aged in the window")
                self.offsets.done(item.partition, item.offset)

    def next_batch(self, version: int, max_wait_s: float) -> list[Item] | None:
        """A full batch when one is ready; a partial one when data stopped coming for max_wait_s."""
        self.drop_stale(version)
        waited = time.monotonic() - self.last_arrival >= max_wait_s
        if not len(self.window) or not (self.window.ready(self.cfg.experiences, self.cfg.token_budget) or waited):
            return None
        groups = self.window.take(self.cfg.experiences, self.cfg.token_budget)
        return [item for g in groups for item in g.items]

    def refused(self, items: list[Item], reason: str, detail: str) -> None:
        """Items the trainer took but could not learn from: to the rejected topic, handled for good."""
        for item in items:
            self._reject(item, reason, detail)
        self.trained.update(i.record_id for i in items)
        for i in items:
            self.offsets.done(i.partition, i.offset)

    def trained_on(self, items: list[Item]) -> None:
        self.trained.update(i.record_id for i in items)
        for i in items:
            self.offsets.done(i.partition, i.offset)

    def step_metrics(self, items: list[Item], step: int) -> dict[str, float]:
        """The intake's part of the metrics of the step that just trained `items`: their count,
        staleness and reward, what was refused or repeated since the last step, the window; the
        counts start again from zero."""
        counts, self.counts = self.counts, IntakeCounts()
        return {"records": float(len(items)), "rejected": float(counts.rejected), "rejected_stale": float(counts.stale),
                "duplicates": float(counts.duplicates), "window_groups": float(len(self.window)),
                **batch_metrics([i.record for i in items], step)}

    def resume_point(self) -> ResumePoint:
        """Where a checkpoint of the current step resumes reading (groups.OffsetTracker's rule)."""
        return ResumePoint(self.offsets.committable(), self.trained.to_list())

    def commit(self) -> dict[tuple[str, int], int]:
        """Commit what is safe (see groups.OffsetTracker); call after the step and checkpoint covering it."""
        offsets = self.offsets.committable()
        self.consumer.commit(offsets)
        return offsets

    def close(self) -> None:
        self.consumer.close()
