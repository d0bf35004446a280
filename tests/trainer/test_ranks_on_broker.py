"""Two gloo trainer ranks through the real broker: `undertow train --nproc 2`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from undertow.schemas import MetricEvent
from undertow.streams import Topics

from .helpers import finish, make_group, produce, read_all, start_trainer, write_config

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_two_ranks_train_each_id_once_and_end_with_the_same_weights(kafka, namespace, tmp_path: Path):
    topics = Topics(namespace)
    groups = [e for g in range(6) for e in make_group(f"task-{g}")]  # 24 experiences
    produce(kafka, topics.ready, groups)
    config = write_config(tmp_path, namespace, {
        "engine": {"zero_stage": 2, "lr": 0.01}, "batching": {"experiences": 8}, "micro_batch_tokens": 16,
        "mini_batches": 2, "checkpoint_every": 1})
    finish(start_trainer(config, "--max-steps", "3", "--nproc", "2"), 300)

    root = tmp_path / "ckpt" / namespace
    ledger = [json.loads(line) for line in (root / "ledger.jsonl").read_text().splitlines()]
    trained = [i for entry in ledger for i in entry["ids"]]
    assert sorted(trained) == sorted(e.experience_id for e in groups)  # each once
    kept = sorted(root.glob("step-*/ranks.json"))  # the last two checkpoints (keep_checkpoints: 2)
    assert [p.parent.name for p in kept] == ["step-00000002", "step-00000003"]
    for path in kept:
        ranks = json.loads(path.read_text())
        assert len(ranks) == 2 and ranks[0] == ranks[1]
    metrics = [m for m in read_all(kafka, topics.metrics, expect=MetricEvent) if m.component == "trainer"]
    assert [m.step for m in metrics] == [1, 2, 3]  # rank 0 alone reports
    assert all(m.values["updates"] == 2 and m.values["records"] == 8 for m in metrics)
