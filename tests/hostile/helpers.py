"""Shared by the hostile-input tests: hand-made wire bytes, and a reader that follows topics."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import msgpack
from kafka import KafkaConsumer, TopicPartition

from undertow.schemas import DecodeError, Experience, Record, Rejected, decode, encode
from undertow.streams import KafkaSettings, RecordProducer, Topics, create_topics
from tests.helpers import wait_for

if TYPE_CHECKING:  # torch comes with the trainer: imported only by the tests that use it
    from undertow.trainer.ready_intake import ReadyIntake


def fresh_namespace(kafka: KafkaSettings, name: str) -> str:
    """A namespace with every topic created, for a module-scoped receiver."""
    ns = f"hx-{name}-{uuid.uuid4().hex[:6]}"
    create_topics(kafka, ns)
    return ns


def fields_of(record: Record) -> dict:
    """The wire map of a valid record, to be edited into a hostile one."""
    return msgpack.unpackb(encode(record), raw=False)


def pack(fields: dict) -> bytes:
    return msgpack.packb(fields, use_bin_type=True)


def f32(values: list[float]) -> bytes:
    """A packed float field as the codec writes it (little-endian float32)."""
    import numpy as np

    return np.asarray(values, dtype="<f4").tobytes()


@dataclass
class Message:
    """One message read back: its key, and the record, or why it did not decode."""

    key: str
    record: Record | None
    error: DecodeError | None = None


class TopicReader:
    """Everything on some topics from their beginning, read on demand (no consumer group)."""

    def __init__(self, kafka: KafkaSettings, topics: list[str]):
        self.consumer = KafkaConsumer(**kafka.kafka_python(), enable_auto_commit=False, fetch_max_bytes=64 << 20,
                                      max_partition_fetch_bytes=32 << 20)
        parts = [TopicPartition(t, p) for t in topics for p in sorted(self.consumer.partitions_for_topic(t) or ())]
        self.consumer.assign(parts)
        self.consumer.seek_to_beginning(*parts)
        self.messages: dict[str, list[Message]] = {t: [] for t in topics}

    def poll(self) -> None:
        for tp, batch in self.consumer.poll(timeout_ms=300).items():
            for m in batch:
                try:
                    self.messages[tp.topic].append(Message((m.key or b"").decode(), decode(m.value or b"")))
                except DecodeError as e:  # kept: a stage that emits undecodable output is a finding
                    self.messages[tp.topic].append(Message((m.key or b"").decode(), None, e))

    def keyed(self, topic: str, prefix: str) -> list[Message]:
        return [m for m in self.messages[topic] if m.key.startswith(prefix)]

    def rejected(self, topic: str, prefix: str) -> list[Rejected]:
        """Rejected records whose original key (group id, or the key a test sent) starts with `prefix`."""
        return [m.record for m in self.messages[topic] if isinstance(m.record, Rejected)
                and (m.record.original_key or b"").decode(errors="replace").startswith(prefix)]

    def wait(self, done: Callable[[], object], timeout: float = 120.0, what: str = "records",
             alive: Callable[[], bool] = lambda: True) -> None:
        deadline = time.monotonic() + timeout
        while not done():
            assert alive(), f"the receiver died while waiting for {what}"
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.poll()

    def close(self) -> None:
        self.consumer.close()


def trainer_intake(kafka: KafkaSettings, topics: Topics, producer: RecordProducer, *, checks_staleness: bool,
                 trained_ids: list[str] = (), group_id: str | None = None, tokenizer: str | None = None,
                 **batching) -> ReadyIntake:
    """The trainer's own intake (trainer/ready_intake.py) on the ready topic, as rank 0 builds it."""
    from undertow.trainer.config import BatchingConfig
    from undertow.trainer.ready_intake import ReadyIntake

    cfg = BatchingConfig(**{"experiences": 4, "group_timeout_s": 1.0, "max_wait_s": 0.5, **batching})
    return ReadyIntake(kafka, topics, cfg, group_id=group_id or f"{topics.namespace}.trainer-{uuid.uuid4().hex[:6]}",
                record_type=Experience, checks_staleness=checks_staleness, producer=producer, start={},
                trained_ids=list(trained_ids), tokenizer=tokenizer)


def train_ids(feed: ReadyIntake, version: int = 0, timeout: float = 120.0) -> list[str]:
    """Drive the feed as the trainer's loop does (fill, take a batch, "train", commit) until every record
    on its topic when called is trained or refused (its offsets committable): a condition, not a quiet
    spell, which a loaded machine can stretch. Returns the ids trained on, in order, repeats included."""
    trained: list[str] = []
    ends = feed.consumer.end_offsets()

    def everything_resolved() -> bool:
        feed.fill(version, timeout_ms=200)
        batch = feed.next_batch(version, max_wait_s=0.5)
        if batch:
            trained.extend(i.record_id for i in batch)
            feed.trained_on(batch)
            feed.commit()
        committable = feed.offsets.committable()
        return all(committable.get(p, 0) >= end for p, end in ends.items())

    wait_for(everything_resolved, timeout, "every record on the topic trained or refused", every=0,
             state=lambda: f"end offsets {ends}, committable {feed.offsets.committable()}, trained {trained}")
    feed.commit()
    return trained
