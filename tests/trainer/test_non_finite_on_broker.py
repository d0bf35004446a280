"""A step none of whose updates was finite: its records go to the rejected topic as non_finite, the
ledger does not list them, and the metric event carries only finite values and counts them."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from undertow.schemas import MetricEvent, Rejected
from undertow.streams import Topics
from undertow.trainer.checkpoint import Ledger, TrainerState
from undertow.trainer.config import TrainerConfig
from undertow.trainer.objectives import objectives
from undertow.trainer.runner import Budget, Leader, StopFlag
from undertow.trainer.step import TrainStepResult

from .helpers import SPEC, make_group, produce, read_all

pytestmark = pytest.mark.broker


def test_a_non_finite_step_refuses_its_records(kafka, namespace, tmp_path: Path):
    topics = Topics(namespace)
    records = make_group("g0") + make_group("g1")
    produce(kafka, topics.ready, records)
    cfg = TrainerConfig.model_validate({"batching": {"experiences": 8, "max_wait_s": 0.5}})
    objective = objectives.get("rl")(cfg.algorithm)
    leader = Leader(SPEC, cfg, kafka, topics, TrainerState(), objective, tmp_path)
    try:
        command = leader.next_command(StopFlag(), Budget(max_steps=1))
        assert sorted(r.experience_id for r in command.records) == sorted(r.experience_id for r in records)
        leader.after_step(TrainStepResult({"loss": math.nan, "updates": 0.0, "skipped_updates": 1.0}, command.records))
        leader.producer.flush()
    finally:
        leader.close()
    rejected = read_all(kafka, topics.rejected, expect=Rejected)
    assert sorted(r.record_id for r in rejected) == sorted(r.experience_id for r in records)
    assert {(r.reason, r.stage) for r in rejected} == {("non_finite", "trainer")}
    assert Ledger(tmp_path).entries() == []
    (event,) = [m for m in read_all(kafka, topics.metrics, expect=MetricEvent) if m.component == "trainer"]
    assert "loss" not in event.values and event.values["skipped_updates"] == 1
    assert event.values["records"] == 0 and event.values["rejected"] == 8  # the step's refusals, counted
