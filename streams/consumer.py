"""Consuming records: decode and validate every message; what fails goes to the rejected topic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Iterator, TypeVar

from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition

from schemas import DecodeError, Record, decode
from streams.connect import connect
from streams.producer import RecordProducer
from streams.settings import KafkaSettings

R = TypeVar("R", bound=Record)


@dataclass
class Delivery(Generic[R]):
    """One decoded record and where it came from."""

    record: R
    topic: str
    partition: int
    offset: int
    key: bytes | None
    timestamp_ms: int


class RecordConsumer(Generic[R]):
    """A kafka-python consumer that yields validated records and dead-letters the rest.

    Offsets are never committed automatically: call `commit()` once the work covering the
    records returned so far is done (at-least-once). A message that does not decode as one of
    `expect` is sent to `rejected_topic` with stage, reason and the original bytes, and consumption
    goes on; `commit()` flushes those dead letters before it moves the offsets past them.
    """

    def __init__(self, settings: KafkaSettings, topics: list[str], *, group_id: str | None,
                 expect: type[R] | tuple[type[Record], ...], rejected_topic: str,
                 producer: RecordProducer | None = None, stage: str = "decode", **overrides: Any):
        # A crashed member's partitions move to the others after 10 s (kafka-python's default is 45 s).
        kw = dict(group_id=group_id, enable_auto_commit=False, auto_offset_reset="earliest",
                  max_partition_fetch_bytes=32 << 20, fetch_max_bytes=64 << 20,
                  session_timeout_ms=10_000, heartbeat_interval_ms=3_000)
        kw.update(overrides)
        self._consumer = connect(KafkaConsumer, settings, *topics, **kw)
        self._owns_producer = producer is None
        self._producer = producer or RecordProducer(settings)
        self.expect, self.rejected_topic, self.stage = expect, rejected_topic, stage
        self.rejected = 0

    @property
    def kafka(self) -> KafkaConsumer:
        """The underlying kafka-python consumer (assign, seek, positions)."""
        return self._consumer

    def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[Delivery[R]]:
        """Fetch, decode and validate; returns only good records, in partition order."""
        batches = self._consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        out: list[Delivery[R]] = []
        for tp, messages in batches.items():
            for m in messages:
                try:
                    record = decode(m.value or b"", expect=self.expect)
                except DecodeError as e:
                    self._dead_letter(m, e)
                    continue
                out.append(Delivery(record, tp.topic, tp.partition, m.offset, m.key, m.timestamp))
        return out

    def __iter__(self) -> Iterator[Delivery[R]]:
        """Yield records forever (until the consumer is closed)."""
        while True:
            yield from self.poll()

    def commit(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        """Commit `offsets` (next offset to read, per partition) or the current positions."""
        self._producer.flush()
        if offsets is None:
            self._consumer.commit()
        else:
            self._consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in offsets.items()})

    def close(self) -> None:
        self._consumer.close()
        if self._owns_producer:
            self._producer.close()

    def __enter__(self) -> "RecordConsumer[R]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _dead_letter(self, m: Any, error: DecodeError) -> None:
        self.rejected += 1
        self._producer.reject(self.rejected_topic, stage=self.stage, reason=error.reason, detail=error.detail,
                              original=m.value or b"", key=m.key, source_topic=m.topic, partition=m.partition,
                              offset=m.offset, record_id=error.record_id)


def read_to_end(settings: KafkaSettings, topic: str) -> Iterator[bytes | None]:
    """The value of every message on `topic` from its beginning to its end offsets of now, partition
    by partition in offset order: a topic read whole once (audits, tests, a resuming feeder)."""
    consumer = connect(KafkaConsumer, settings, enable_auto_commit=False, fetch_max_bytes=64 << 20,
                       max_partition_fetch_bytes=32 << 20)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            for tp, messages in consumer.poll(timeout_ms=500).items():
                yield from (m.value for m in messages if m.offset < ends[tp])
    finally:
        consumer.close()
