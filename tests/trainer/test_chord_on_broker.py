"""CHORD through the broker: the trainer takes `mixing.expert_per_step` demonstrations of the expert
topic into every RL step, learns them, checkpoints where it read both topics, and a restart takes
only demonstrations it has not trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from undertow.kernel.models import build_tokenizer
from undertow.schemas import Experience, MetricEvent
from undertow.streams import Topics

from .helpers import SPEC, finish, make_group, produce, read_all, start_trainer, write_config

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def demonstrations(start: int, n: int) -> list[Experience]:
    tok = build_tokenizer(SPEC)
    prompt, answer = tok("2+2=")["input_ids"], tok("4")["input_ids"] + [tok.eos_token_id]
    return [Experience(experience_id=f"expert-{i}", task_id=f"expert-{i}", group_id=f"expert-{i}",
                       prompt_tokens=prompt, response_tokens=answer, policy_version=0, finish_reason="stop")
            for i in range(start, start + n)]


def trained_ids(tmp_path: Path, namespace: str) -> list[str]:
    ledger = (tmp_path / "ckpt" / namespace / "ledger.jsonl").read_text().splitlines()
    return [i for line in ledger for i in json.loads(line)["ids"]]


def test_demonstrations_join_each_step_and_are_trained_once(kafka, namespace, tmp_path: Path):
    topics = Topics(namespace)
    produce(kafka, topics.ready, [e for g in range(6) for e in make_group(f"task-{g}")])  # 24: 3 steps of 8
    produce(kafka, topics.expert, demonstrations(0, 12))
    settings = {"engine": {"zero_stage": 0, "lr": 0.01}, "batching": {"experiences": 8},
                "mixing": {"expert_per_step": 4, "mu_peak": 0.5}, "sync_every": 1, "checkpoint_every": 100}
    config = write_config(tmp_path, namespace, settings)
    finish(start_trainer(config, "--max-steps", "3", port=29551), 240)

    steps = [m.values for m in read_all(kafka, topics.metrics, expect=MetricEvent) if m.component == "trainer"]
    assert [s["expert_records"] for s in steps] == [4, 4, 4] and [s["records"] for s in steps] == [8, 8, 8]
    assert all(s["mu"] == 0.5 for s in steps)
    assert steps[-1]["expert_nll"] < steps[0]["expert_nll"]  # the demonstrations are learned
    first = trained_ids(tmp_path, namespace)
    assert sorted(i for i in first if i.startswith("expert")) == sorted(f"expert-{i}" for i in range(12))

    # A restart reads both topics from the checkpoint: new RL data and the 4 new demonstrations only.
    produce(kafka, topics.ready, make_group("task-6") + make_group("task-7"))
    produce(kafka, topics.expert, demonstrations(12, 4))
    finish(start_trainer(config, "--max-steps", "4", port=29552), 240)
    again = trained_ids(tmp_path, namespace)[len(first):]
    assert sorted(i for i in again if i.startswith("expert")) == [f"expert-{i}" for i in range(12, 16)]
    assert len(again) == 8 + 4
