"""The trainer's Kafka side (rank 0): read `experiences.ready`, admit, assemble groups, hand out
batches, commit, and keep the books of it: what a step's metrics say about its records, and where a
checkpoint resumes. The pure parts are in groups.py and window.py.

Partitions are assigned manually (the trainer is one logical consumer) and start at the
checkpoint's offsets, else the group's committed ones, else the beginning.

With replay (trainer/replay.py) each batch is fresh groups from the window plus groups trained before,
drawn from the replay buffer; the buffer is rebuilt after a restart by reading its records back from
the ready topic at the offsets the checkpoint kept.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Sequence

from undertow.schemas import DecodeError, Experience, Record, decode, encode
from undertow.streams import KafkaSettings, RecordConsumer, RecordProducer, Topics

from .config import BatchingConfig, ReplayConfig
from .groups import (GroupAssembler, Item, OffsetTracker, Partition, TrainedIds, batch_metrics, check_experience,
                     check_tokenizer, check_vocabulary)
from .replay import ReplayBuffer, ReplaySaved, mix
from .window import Window

STAGE = "trainer"
READ_BACK_S = 60.0  # longest a restart waits to read the replay buffer's records back
log = logging.getLogger(__name__)


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
                 tokenizer: str | None = None, topic: str | None = None, vocab_size: int | None = None,
                 replay: ReplayConfig | None = None, replay_saved: Sequence[ReplaySaved] = ()):
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
        self.committed = self.offsets.committable()  # where it starts is where the last commit left it
        self.last_arrival = time.monotonic()
        self.replay = None if replay is None else ReplayBuffer(
            sampler=replay.sampler, capacity=replay.capacity_groups, max_uses=replay.max_uses, seed=seed)
        self.replay_ratio = replay.ratio if replay is not None else 0.0
        self.replayed: set[str] = set()  # ids of the last batch's records drawn from the replay buffer
        if self.replay is not None and replay_saved:
            found = read_back(settings, replay_saved, record_type)
            lost = self.replay.restore(replay_saved, found)
            if lost:
                log.warning("replay: %d group(s) of the checkpoint are no longer on %s (retention?): %s",
                            len(lost), self.topic, lost[:5])

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
        """A full batch when one is ready; a partial one when data stopped coming for max_wait_s. With
        replay: its reused groups (last, ids in `replayed`) and fresh groups for the rest of the budget;
        a batch needs fresh data, reuse alone never makes one."""
        self.drop_stale(version)
        waited = time.monotonic() - self.last_arrival >= max_wait_s
        batch = mix(self.window, self.replay, self.replay_ratio, version, self.cfg.experiences, self.cfg.token_budget,
                    waited=waited)
        if batch is None:
            return None
        again = [item for g in batch.reused for item in g.group.items]
        self.replayed = {i.record_id for i in again}
        return [item for g in batch.fresh for item in g.items] + again

    def refused(self, items: list[Item], reason: str, detail: str) -> None:
        """Items the trainer took but could not learn from: to the rejected topic, handled for good
        (reused ones were trained before: they only leave the replay buffer)."""
        if self.replay is not None:
            self.replay.discard({i.record_id for i in items if i.record_id in self.replayed})
        items = [i for i in items if i.record_id not in self.replayed]
        for item in items:
            self._reject(item, reason, detail)
        self.trained.update(i.record_id for i in items)
        for i in items:
            self.offsets.done(i.partition, i.offset)

    def trained_on(self, items: list[Item], step: int = 0) -> None:
        """Items step `step` trained on: fresh ones are done (and join the replay buffer), reused ones
        count one more use."""
        fresh = [i for i in items if i.record_id not in self.replayed]
        self.trained.update(i.record_id for i in fresh)
        for i in fresh:
            self.offsets.done(i.partition, i.offset)
        if self.replay is not None:
            self.replay.used({i.record_id for i in items if i.record_id in self.replayed})
            self.replay.add(fresh, step)

    def step_metrics(self, items: list[Item], step: int) -> dict[str, float]:
        """The intake's part of the metrics of the step that just trained `items`: their count,
        staleness and reward, what was refused or repeated since the last step, the window; the
        counts start again from zero."""
        counts, self.counts = self.counts, IntakeCounts()
        fresh = [i for i in items if i.record_id not in self.replayed]
        values = {"records": float(len(items)), "rejected": float(counts.rejected),
                  "rejected_stale": float(counts.stale), "duplicates": float(counts.duplicates),
                  "window_groups": float(len(self.window)), **batch_metrics([i.record for i in fresh], step)}
        if self.replay is not None:  # staleness above is the fresh records' (the bound applies to them only)
            reused = len(items) - len(fresh)
            values.update(reused_records=float(reused), reuse_fraction=reused / len(items) if items else 0.0,
                          replay_groups=float(len(self.replay)), replay_mean_uses=self.replay.mean_uses())
        return values

    def resume_point(self) -> ResumePoint:
        """Where a checkpoint of the current step resumes reading (groups.OffsetTracker's rule)."""
        return ResumePoint(self.offsets.committable(), self.trained.to_list())

    def commit(self) -> dict[tuple[str, int], int]:
        """Commit what is safe (see groups.OffsetTracker); call after the step and checkpoint covering it."""
        offsets = self.offsets.committable()
        self.consumer.commit(offsets)
        self.committed = offsets
        return offsets

    def moved(self) -> bool:
        """Whether records were handled (trained, refused, rejected) since the last commit."""
        return self.offsets.committable() != self.committed

    def close(self) -> None:
        self.consumer.close()


def read_back(settings: KafkaSettings, saved: Sequence[ReplaySaved], record_type: type[Record]) -> dict[Any, Record]:
    """The records at the positions the checkpoint's replay groups name, by ((topic, partition), offset):
    each partition read from the lowest such offset to the highest (or its end: a record gone with the
    retention is simply not found). Messages in between are not decoded (what was bad was dead-lettered
    when first read)."""
    wanted: dict[tuple[str, int], set[int]] = {}
    for group in saved:
        for r in group.records:
            wanted.setdefault((r.topic, r.partition), set()).add(r.offset)
    found: dict[Any, Record] = {}
    consumer = RecordConsumer(settings, [], group_id=None)
    try:
        for topic in sorted({t for t, _ in wanted}):
            consumer.assign(topic, {p: min(offsets) for p, offsets in wanted.items()})
            consumer.pause([p for p in consumer.positions() if p not in wanted])
            end = consumer.end_offsets()
            target = {p: min(max(offsets) + 1, end[p]) for p, offsets in wanted.items() if p[0] == topic}
            deadline = time.monotonic() + READ_BACK_S
            while not consumer.reached(target) and time.monotonic() < deadline:
                for m in consumer.poll_messages(timeout_ms=500):
                    if m.offset in wanted.get((m.topic, m.partition), ()):
                        try:
                            found[((m.topic, m.partition), m.offset)] = decode(m.value, expect=record_type)
                        except DecodeError:
                            pass  # not a record we trained on: its group is left out
    finally:
        consumer.close()
    return found
