"""SIGKILL after step 3 under ZeRO-2, restart: every experience trained exactly once; SIGTERM stops cleanly.
The trainer runs PPO with a critic, whose weights and optimizer come back from the checkpoint too."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from undertow.streams import Topics
from tests.helpers import wait_for

from undertow.schemas import MetricEvent

from .helpers import finish, make_group, produce, read_all, start_trainer, write_config

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def ledger(root: Path) -> list[dict]:
    path = root / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_sigkill_then_resume_trains_every_experience_exactly_once(kafka, namespace, tmp_path: Path):
    topics = Topics(namespace)
    batches = [[e for g in (2 * b, 2 * b + 1) for e in make_group(f"task-{g}")] for b in range(5)]  # 5 x 8
    config = write_config(tmp_path, namespace, {
        "engine": {"zero_stage": 2, "lr": 0.01}, "batching": {"experiences": 8, "max_staleness": 10},
        "checkpoint_every": 2, "sync_every": 2,
        "algorithm": {"advantage_transform": "gae"}, "critic": {"lr": 0.01}})
    root = tmp_path / "ckpt" / namespace

    first = start_trainer(config)
    for b in range(3):  # one batch at a time, so the kill lands right after step 3
        produce(kafka, topics.ready, batches[b])
        wait_for(lambda: len(ledger(root)) == b + 1, 120, f"step {b + 1} in the ledger", proc=first,
                 state=lambda: ledger(root))
    wait_for(lambda: (root / "LATEST").exists() and (root / "LATEST").read_text() == "step-00000002", 120,
             "the step-2 checkpoint", proc=first, state=lambda: sorted(p.name for p in root.glob("*")))
    first.kill()
    first.communicate()
    assert len(ledger(root)) == 3  # step 3 ran, but its checkpoint never happened

    produce(kafka, topics.ready, batches[3] + batches[4])
    second = start_trainer(config)
    wait_for(lambda: len(ledger(root)) == 5 and ledger(root)[-1]["step"] == 5, 120, "step 5 in the ledger", proc=second,
             state=lambda: ledger(root))
    second.send_signal(signal.SIGTERM)
    out = finish(second, 120)
    assert "stopped at step 5" in out

    entries = ledger(root)
    assert [e["step"] for e in entries] == [1, 2, 3, 4, 5]
    counts = Counter(i for e in entries for i in e["ids"])
    assert sorted(counts) == sorted(e.experience_id for b in batches for e in b)
    assert set(counts.values()) == {1}
    assert (root / "LATEST").read_text() == "step-00000005"
    state = json.loads((root / "step-00000005" / "trainer_state.json").read_text())
    assert state["step"] == 5 and state["published_version"] == 5 and len(state["trained_ids"]) == 40
    # The critic came back from step 2's checkpoint: a fresh one's head is 0, and so would be every value.
    assert (root / "step-00000005" / "critic").is_dir() and "has no critic" not in out
    metrics = {m.step: m.values for m in read_all(kafka, topics.metrics, expect=MetricEvent) if m.component == "trainer"}
    assert metrics[1]["value_mean"] == 0.0 and metrics[3]["value_mean"] != 0.0 and metrics[4]["value_mean"] != 0.0

    consumer = KafkaConsumer(**kafka.kafka_python(), group_id="undertow-trainer", enable_auto_commit=False)
    parts = [TopicPartition(topics.ready, p) for p in consumer.partitions_for_topic(topics.ready)]
    ends = consumer.end_offsets(parts)
    assert {tp: consumer.committed(tp) or 0 for tp in parts} == ends  # committed after the last checkpoint
    consumer.close()
