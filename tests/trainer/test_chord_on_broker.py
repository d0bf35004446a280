"""CHORD through the broker: the trainer takes `mixing.expert_per_step` demonstrations of the expert
topic into every RL step, learns them, checkpoints where it read both topics, and a restart takes
only demonstrations it has not trained."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from undertow.schemas import MetricEvent
from undertow.streams import Topics

from .helpers import env, finish, make_group, produce, read_all, start_trainer, write_config

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def load_demonstrations(config: Path, path: Path, n: int) -> None:
    """`undertow load CONFIG FILE --to expert` of n rows teaching "2+2=" -> "4" (ids `<stem>:<line>:…`)."""
    path.write_text("".join(json.dumps({"prompt": "2+2=", "response": "4"}) + "\n" for _ in range(n)))
    out = subprocess.run([sys.executable, "-m", "undertow.infra.cli", "load", str(config), str(path), "--to", "expert"],
                         capture_output=True, text=True, timeout=120, env=env())
    assert out.returncode == 0 and f"loaded {n} conversations" in out.stdout, out.stdout + out.stderr


def trained_ids(tmp_path: Path, namespace: str) -> list[str]:
    ledger = (tmp_path / "ckpt" / namespace / "ledger.jsonl").read_text().splitlines()
    return [i for line in ledger for i in json.loads(line)["ids"]]


def test_demonstrations_join_each_step_and_are_trained_once(kafka, namespace, tmp_path: Path):
    topics = Topics(namespace)
    produce(kafka, topics.ready, [e for g in range(6) for e in make_group(f"task-{g}")])  # 24: 3 steps of 8
    settings = {"engine": {"zero_stage": 0, "lr": 0.01}, "batching": {"experiences": 8},
                "mixing": {"expert_per_step": 4, "mu_peak": 0.5}, "sync_every": 1, "checkpoint_every": 100}
    config = write_config(tmp_path, namespace, settings)
    raw = yaml.safe_load(config.read_text())
    config.write_text(yaml.safe_dump({**raw, "rollout": {"chat_template": False}}))
    load_demonstrations(config, tmp_path / "demos.jsonl", 12)
    finish(start_trainer(config, "--max-steps", "3"), 240)

    steps = [m.values for m in read_all(kafka, topics.metrics, expect=MetricEvent) if m.component == "trainer"]
    assert [s["expert_records"] for s in steps] == [4, 4, 4] and [s["records"] for s in steps] == [8, 8, 8]
    assert all(s["mu"] == 0.5 for s in steps)
    assert steps[-1]["expert_nll"] < steps[0]["expert_nll"]  # the demonstrations are learned
    first = trained_ids(tmp_path, namespace)
    assert sorted(int(i.split(":")[1]) for i in first if i.startswith("demos:")) == list(range(1, 13))

    # A restart reads both topics from the checkpoint: new RL data and the 4 new demonstrations only.
    produce(kafka, topics.ready, make_group("task-6") + make_group("task-7"))
    load_demonstrations(config, tmp_path / "more.jsonl", 4)
    finish(start_trainer(config, "--max-steps", "4"), 240)
    again = trained_ids(tmp_path, namespace)[len(first):]
    assert sorted(int(i.split(":")[1]) for i in again if i.startswith("more:")) == [1, 2, 3, 4]
    assert len(again) == 8 + 4
