"""Offline training from history: SFT on the best samples and DPO on best-vs-worst pairs lower their loss."""

from __future__ import annotations

from pathlib import Path

import pytest

from undertow.streams import RecordProducer, RunContext, Topics, create_topics
from undertow.streams.archive import ArchiveConfig, Archiver
from undertow.streams.history import History
from undertow.streams.replay import Selection, replay

from tests.helpers import produce, start_cli, write_config

from .helpers import make_group

pytestmark = [pytest.mark.broker, pytest.mark.slow]
GROUPS = 12


def archive_recorded_run(kafka, namespace: str, root: Path) -> History:
    produce(kafka, Topics(namespace).ready, [e for g in range(GROUPS) for e in make_group(g)])
    stats = Archiver(ArchiveConfig(root=str(root), topics=["experiences.ready"]), RunContext(namespace=namespace, kafka=kafka)).run(
        lambda: False, max_records=4 * GROUPS)
    assert stats.rows == 4 * GROUPS
    return History.from_archive(str(root), [namespace])


def trainer_losses(kafka, namespace: str) -> list[float]:
    rows = History.from_topics(kafka, namespace).query(
        "SELECT step, \"values\"['loss'] AS loss FROM metrics WHERE component = 'trainer' ORDER BY step").to_pylist()
    assert [r["step"] for r in rows] == list(range(1, len(rows) + 1))
    return [r["loss"] for r in rows]


def test_offline_sft_and_dpo_from_a_replay_lower_their_loss(kafka, namespace, tmp_path: Path):
    history = archive_recorded_run(kafka, namespace, tmp_path / "archive")
    runs = {}
    for objective, shape in (("sft", "sft_best"), ("dpo", "dpo_pairs")):
        target = f"{namespace}-{objective}"
        create_topics(kafka, target)
        with RecordProducer(kafka) as producer:
            result = replay(history, Selection(where="reward IS NOT NULL"), shape, producer, Topics(target).ready)
        assert result.selected == 4 * GROUPS and result.sent == GROUPS  # one best sample / one pair per group
        config = write_config(tmp_path / f"{target}.yaml", target, trainer={
            "checkpoint_dir": str(tmp_path / "ckpt"), "checkpoint_every": 100,
            "engine": {"lr": 0.01},
            "batching": {"experiences": 2, "max_wait_s": 1.0}, "algorithm": {"objective": objective}})
        runs[target] = start_cli("train", str(config), "--max-steps", "6")
    for target, proc in runs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, out[-5000:]
        losses = trainer_losses(kafka, target)
        assert len(losses) == 6
        assert sum(losses[-2:]) < sum(losses[:2]), (target, losses)
    dpo_first = trainer_losses(kafka, f"{namespace}-dpo")[0]
    assert dpo_first == pytest.approx(0.6931, abs=1e-3)  # log 2: the policy starts as its own reference
