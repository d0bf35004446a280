"""Replay through the real broker, in-process: the trainer's leader reads the ready topic, mixes reused
groups into each step at the configured ratio, the tiny model trains on them (reused records carry their
behaviour log-probs: the ratio is no longer 1), the ledger books each reuse apart, the audit counts
every fresh record once and the reuses separately, and a restart reads the buffer back from the topic
at the offsets the checkpoint kept, with its use counts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.audit import audit
from undertow.kernel.models import build_model
from undertow.schemas import MetricEvent
from undertow.streams import Topics
from undertow.trainer.checkpoint import Ledger, TrainerState
from undertow.trainer.config import TrainerConfig
from undertow.trainer.objectives import objectives
from undertow.trainer.runner import Budget, Leader, StopFlag
from undertow.trainer.step import TrainStepResult

from .helpers import SPEC, make_group, produce, read_all

pytestmark = pytest.mark.broker


def train(model, optimizer, objective, records) -> dict[str, float]:
    """One real optimizer update of the tiny model on the step's records (what train_step does on one rank)."""
    batch = objective.collate(records, pad_id=0, pad_to_multiple=8)
    out = objective.loss(model, batch, None, objective.totals(records))
    optimizer.zero_grad()
    out.loss.backward()
    optimizer.step()
    return {**out.metrics, **out.parts, "updates": 1.0}


def run_steps(leader: Leader, state: TrainerState, steps: int, model, optimizer, objective) -> list[list[str]]:
    batches = []
    for _ in range(steps):
        command = leader.next_command(StopFlag(), Budget(max_steps=state.step + 1))
        assert command.records, "no batch"
        metrics = train(model, optimizer, objective, command.records)
        state.step += 1
        leader.after_step(TrainStepResult(metrics, []))
        batches.append([r.experience_id for r in command.records])
    leader.producer.flush()
    return batches


def test_replay_reuses_trained_groups_books_them_apart_and_survives_a_restart(kafka, namespace, tmp_path: Path):
    topics = Topics(namespace)
    model = build_model(SPEC)
    groups = [make_group(f"g{i}", model=model) for i in range(4)]  # 4 groups of 4, behaviour log-probs of v0
    records = [e for g in groups for e in g]
    produce(kafka, topics.raw, records)  # what the rollout published (the audit's "published")
    produce(kafka, topics.ready, records)
    # 8 a step, half reused: step 1 is 2 fresh groups (nothing trained yet); steps 2 and 3 are one
    # reused group (4 ≤ ⌊0.5 · 8⌋) and one fresh.
    cfg = TrainerConfig.model_validate({"batching": {"experiences": 8, "max_wait_s": 0.5},
                                        "replay": {"ratio": 0.5, "max_uses": 3}})
    objective = objectives.get("rl")(cfg.algorithm)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    state = TrainerState()
    leader = Leader(SPEC, cfg, kafka, topics, state, objective, tmp_path)
    try:
        batches = run_steps(leader, state, 3, model, optimizer, objective)
        saved = TrainerState.model_validate_json(leader.snapshot().model_dump_json())  # as a checkpoint keeps it
        held = {g.group.group_id: g.uses for g in leader.intake.replay.groups()}
    finally:
        leader.close()

    ledger = Ledger(tmp_path).entries()
    assert [len(e["ids"]) for e in ledger] == [8, 4, 4] and [len(e.get("reused", [])) for e in ledger] == [0, 4, 4]
    assert ledger[0]["ids"] == batches[0] and ledger[1]["ids"] + ledger[1]["reused"] == batches[1]
    reused_groups = [{i.split("/")[0] for i in e["reused"]} for e in ledger[1:]]
    assert all(len(g) == 1 for g in reused_groups)  # whole groups
    assert reused_groups[0] <= {"g0", "g1"}  # step 2 could only reuse what step 1 trained

    books = audit(kafka, namespace, tmp_path / "ledger.jsonl")
    assert books.published == {e.experience_id for e in records}
    assert books.lost == set() and books.twice == set() and books.reused_untrained == set()
    assert sum(books.reused.values()) == 8 and all(n == 1 for n in books.trained.values())

    steps = [m.values for m in read_all(kafka, topics.metrics, expect=MetricEvent) if m.component == "trainer"]
    assert [s["reuse_fraction"] for s in steps] == [0.0, 0.5, 0.5]
    assert [s["records"] for s in steps] == [8, 8, 8] and [s["reused_records"] for s in steps] == [0, 4, 4]
    # after step 2: the reused group has 2 uses, the other of step 1 and step 2's fresh one 1: (2+1+1)·4 / 12
    assert steps[0]["replay_mean_uses"] == 1.0 and steps[1]["replay_mean_uses"] == pytest.approx(4 / 3)
    assert steps[1]["ratio_mean"] != pytest.approx(1.0, abs=1e-4)  # v0's log-probs under the trained weights

    # A restart: the buffer is read back from the ready topic at the offsets the checkpoint kept.
    assert sorted(s.group_id for s in saved.replay) == sorted(held)
    again = Leader(SPEC, cfg, kafka, topics, saved, objective, tmp_path)
    try:
        back = {g.group.group_id: g.uses for g in again.intake.replay.groups()}
        ids = {g.group.group_id: [i.record_id for i in g.group.items] for g in again.intake.replay.groups()}
    finally:
        again.close()
    assert back == held and ids == {gid: [f"{gid}/{i}" for i in range(4)] for gid in held}
