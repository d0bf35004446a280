"""The trainer on the real broker: learning, publishing weights, checkpoints, stale experiences."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from undertow.kernel.models import build_model, build_tokenizer, fingerprint, load_weights
from undertow.schemas import MetricEvent, Rejected, WeightUpdate, assemble_weights
from undertow.streams import Topics
from tests.helpers import read_again, wait_for

from .helpers import SPEC, behaviour_logprobs, make_group, finish, produce, read_all, start_trainer, write_config

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def latest_weights(kafka, topic: str) -> tuple[int, bytes]:
    """What a late rollout worker does: read the topic, keep the newest version whose chunks are all there."""
    by_version: dict[int, list[WeightUpdate]] = {}
    for u in read_all(kafka, topic, expect=WeightUpdate):
        by_version.setdefault(u.version, []).append(u)
    complete = [v for v, chunks in by_version.items() if {c.chunk_index for c in chunks} == set(range(chunks[0].num_chunks))]
    version = max(complete)
    return version, assemble_weights(by_version[version])


def test_trainer_learns_publishes_and_rejects_stale(kafka, namespace, tmp_path: Path):
    topics = Topics(namespace)
    groups = [e for g in range(6) for e in make_group(f"task-{g}")]  # 24 experiences, groups of 4
    produce(kafka, topics.ready, groups)
    settings = {"engine": {"zero_stage": 0, "lr": 0.01}, "batching": {"experiences": 8, "max_staleness": 4},
                "sync_every": 1, "weights": {"chunk_bytes": 65536}, "checkpoint_every": 100}
    config = write_config(tmp_path, namespace, settings)

    run = start_trainer(config, "--max-steps", "3")
    finish(run, 240)

    metrics = [m for m in read_all(kafka, topics.metrics, expect=MetricEvent) if m.component == "trainer"]
    assert [m.step for m in metrics] == [1, 2, 3]
    assert all(m.values["records"] == 8 and m.values["tokens_per_s"] > 0 for m in metrics)
    assert metrics[0].values["ratio_mean"] == pytest.approx(1.0, abs=1e-4)  # on-policy first step
    losses = [m.values["loss"] for m in metrics]
    assert losses[0] != losses[-1]

    # The published version 3 loads into a fresh model, equals the HF export, and learned the task.
    version, blob = latest_weights(kafka, topics.weights)
    assert version == 3
    # Every announcement says which tokenizer the trainer reads the ids with (rollout workers check it).
    assert {u.tokenizer for u in read_all(kafka, topics.weights, expect=WeightUpdate)} == {
        fingerprint(build_tokenizer(SPEC))}
    engine_side = build_model(SPEC)
    load_weights(engine_side, blob)
    export = (tmp_path / "ckpt" / namespace / "step-00000003" / "hf")
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(export).state_dict()
    for name, tensor in engine_side.state_dict().items():
        assert torch.equal(tensor, exported[name]), name
    good, bad = groups[0], groups[1]
    assert sum(behaviour_logprobs(good.prompt_tokens, good.response_tokens, engine_side)) > sum(good.behaviour_logprobs)
    assert sum(behaviour_logprobs(bad.prompt_tokens, bad.response_tokens, engine_side)) < sum(bad.behaviour_logprobs)

    # Restart at step 3 with max_staleness 1: new version-0 samples are 3 steps old -> rejected "stale".
    stale = make_group("old-task", version=0)
    fresh = make_group("new-task", version=3, model=engine_side)
    produce(kafka, topics.ready, stale + fresh)
    settings["batching"]["max_staleness"] = 1
    config = write_config(tmp_path, namespace, settings)
    run = start_trainer(config, "--idle-timeout", "6")
    finish(run, 240)
    rejected = [r for r in read_all(kafka, topics.rejected, expect=Rejected)]
    assert sorted(r.record_id for r in rejected) == sorted(e.experience_id for e in stale)
    assert {r.reason for r in rejected} == {"stale"} and all(r.stage == "trainer" for r in rejected)
    ledger = (tmp_path / "ckpt" / namespace / "ledger.jsonl").read_text().splitlines()
    trained = [i for line in ledger for i in __import__("json").loads(line)["ids"]]
    # steps 1-3 took 24, the restart the 4 fresh ones (the 24 old are skipped: committed or trained)
    assert sorted(trained) == sorted([e.experience_id for e in groups + fresh])


def test_records_handled_without_a_checkpoint_are_committed_once_the_trainer_idles(kafka, namespace, tmp_path: Path):
    """Two steps, then only stale records: checkpoint_every (100) is never reached, yet after
    idle_checkpoint_s without a batch the trainer checkpoints step 2 and commits, and its
    group's lag reaches 0 while it runs (as the network-chaos run's trainer did not, after a heal)."""
    topics = Topics(namespace)
    groups = [e for g in range(6) for e in make_group(f"task-{g}")]
    produce(kafka, topics.ready, groups)  # all version 0: the eight steps 1 and 2 did not take are stale after them
    settings = {"engine": {"zero_stage": 0, "lr": 0.01}, "consumer_group": f"trainer-{namespace}",
                "batching": {"experiences": 8, "max_staleness": 1}, "checkpoint_every": 100,
                "idle_checkpoint_s": 2.0}
    run = start_trainer(write_config(tmp_path, namespace, settings), "--idle-timeout", "300")
    lag = lambda: {p: len(left) for p, left in read_again(kafka, f"trainer-{namespace}", topics.ready).items() if left}
    try:
        wait_for(lambda: not lag(), 120, "the trainer's group to commit every ready record", proc=run, state=lag)
        assert run.poll() is None  # committed while running, not by the stop's checkpoint
    finally:
        run.terminate()
        finish(run, 120)
    rejected = read_all(kafka, topics.rejected, expect=Rejected)
    assert len(rejected) == 8 and {r.reason for r in rejected} == {"stale"}
    assert len({r.record_id.split("/")[0] for r in rejected}) == 2  # two whole groups
    assert (tmp_path / "ckpt" / namespace / "step-00000002").is_dir()
