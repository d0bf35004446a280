"""Helpers for the rollout tests that run against the real broker."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from kafka import KafkaConsumer, TopicPartition

from schemas import Record, decode
from streams import KafkaSettings


def write_config(path: Path, namespace: str, **sections) -> Path:
    path.write_text(yaml.safe_dump({"namespace": namespace, "model": {"source": "tiny"}, **sections}))
    return path


def read_all(kafka: KafkaSettings, topic: str, expect: type[Record] | tuple = Record) -> list:
    """Every record on a topic right now, in partition order."""
    consumer = KafkaConsumer(**kafka.kafka_python(), enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        ends = consumer.end_offsets(parts)
        out = []
        while any(consumer.position(tp) < ends[tp] for tp in parts):
            for messages in consumer.poll(timeout_ms=500).values():
                out += [decode(m.value, expect=expect) for m in messages]
        return out
    finally:
        consumer.close()


def wait_for(predicate, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def config_path(tmp_path, namespace):
    def make(**sections) -> Path:
        return write_config(tmp_path / "run.yaml", namespace, **sections)
    return make
