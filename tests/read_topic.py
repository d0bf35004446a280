"""Reading a whole topic back in tests: every record from the beginning to the end offsets of now."""

from __future__ import annotations

from kafka import KafkaConsumer, TopicPartition

from schemas import Record, decode
from streams import KafkaSettings


def read_all(kafka: KafkaSettings, topic: str, expect: type[Record] | tuple | None = None) -> list:
    """Every record on `topic` now (decoded and validated as `expect`), in partition order."""
    consumer = KafkaConsumer(**kafka.kafka_python(), enable_auto_commit=False, fetch_max_bytes=64 << 20,
                             max_partition_fetch_bytes=32 << 20)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        out = []
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            for tp, messages in consumer.poll(timeout_ms=500).items():
                out += [decode(m.value, expect=expect) for m in messages if m.offset < ends[tp]]
        return out
    finally:
        consumer.close()
