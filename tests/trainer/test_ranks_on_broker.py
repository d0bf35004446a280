"""Two gloo trainer ranks through the real broker: `undertow train --nproc 2`."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import psutil
import pytest

from undertow.schemas import MetricEvent
from undertow.streams import Topics
from tests.helpers import holds_for, wait_for

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


# Rank 0's empty commands come every quarter of it (2 s): 6 s of slack for a loaded machine's scheduling.
COLLECTIVE_TIMEOUT_S = 8


def _rank(trainer: psutil.Process, rank: int) -> psutil.Process:
    """torchrun's worker process of `rank`."""
    (worker,) = [p for p in trainer.children(recursive=True) if p.environ().get("RANK") == str(rank)
                 and "undertow.infra.cli" in p.cmdline()]
    return worker


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


def test_two_ranks_wait_out_an_idle_topic_and_a_frozen_rank_stops_the_trainer_not_the_batch(kafka, namespace,
                                                                                             tmp_path: Path):
    """Rank 1 waits for each step's command inside a collective, which times out (`collective_timeout_s`).
    An idle topic must not trip it (rank 0 sends empty commands meanwhile); a rank that stops answering
    (frozen here; cut off by the network in benchmarks/network_chaos.py) must: the trainer exits for its
    supervisor to restart, the batch is not dead-lettered, and the restart trains it once."""
    topics = Topics(namespace)
    batches = [[e for g in range(2) for e in make_group(f"task-{b}-{g}")] for b in range(3)]  # 8 experiences each
    config = write_config(tmp_path, namespace, {
        "engine": {"collective_timeout_s": COLLECTIVE_TIMEOUT_S}, "batching": {"experiences": 8, "max_wait_s": 0},
        "micro_batch_tokens": 16, "checkpoint_every": 1})
    ledger = tmp_path / "ckpt" / namespace / "ledger.jsonl"
    steps = lambda: len(ledger.read_text().splitlines()) if ledger.exists() else 0  # noqa: E731
    trainer = start_trainer(config, "--nproc", "2")
    try:
        produce(kafka, topics.ready, batches[0])
        wait_for(lambda: steps() == 1, 300, "the first step", proc=trainer)
        leader, frozen = (_rank(psutil.Process(trainer.pid), r) for r in (0, 1))
        holds_for(lambda: _running(leader) and _running(frozen), 3 * COLLECTIVE_TIMEOUT_S,
                  "two ranks waiting on an idle topic")
        produce(kafka, topics.ready, batches[1])
        wait_for(lambda: steps() == 2, 120, "the second step", proc=trainer)

        frozen.send_signal(signal.SIGSTOP)
        try:
            produce(kafka, topics.ready, batches[2])
            wait_for(lambda: not _running(leader), 120,
                     "rank 0 to give up on the frozen rank", state=lambda: f"{steps()} steps")
        finally:
            frozen.send_signal(signal.SIGCONT)  # torchrun's SIGTERM reaches it now
        out, _ = trainer.communicate(timeout=120)
    finally:
        if trainer.poll() is None:  # a failed wait: no rank may outlive the test
            for process in [*psutil.Process(trainer.pid).children(recursive=True), psutil.Process(trainer.pid)]:
                process.kill()
            trainer.wait()
    assert trainer.returncode != 0 and "Timed out" in out, out[-5000:]
    assert steps() == 2, out[-5000:]
    assert read_all(kafka, topics.rejected) == []  # the network failed, not the batch

    finish(start_trainer(config, "--nproc", "2", "--max-steps", "3"), 300)
    trained = [i for line in ledger.read_text().splitlines() for i in json.loads(line)["ids"]]
    assert sorted(trained) == sorted(e.experience_id for batch in batches for e in batch)  # each once
