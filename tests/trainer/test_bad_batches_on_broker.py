"""Records the model cannot take, through the real trainer on the broker: token ids outside its
vocabulary are refused at the intake; a batch whose forward pass raises (a prompt longer than the
model's positions) is dead-lettered with the error, and the trainer goes on to train the next one."""

from __future__ import annotations

from pathlib import Path

import pytest

from undertow.schemas import MetricEvent, Rejected
from undertow.streams import Topics
from undertow.trainer.checkpoint import Ledger

from .helpers import SPEC, finish, make_group, produce, read_all, start_trainer, write_config

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_out_of_vocabulary_ids_are_refused_and_a_failing_batch_is_dead_lettered(kafka, namespace, tmp_path: Path):
    topics = Topics(namespace)
    vocabulary = make_group("oov")
    ids = [10**6] + vocabulary[2].response_tokens[1:]  # the tiny model has < 100 ids
    vocabulary[2] = vocabulary[2].model_copy(update={"response_tokens": ids})
    too_long = [e.model_copy(update={"prompt_tokens": e.prompt_tokens * 100})  # 400 positions; it has n_positions
                for e in make_group("long")]
    assert len(too_long[0].prompt_tokens) > SPEC.tiny.n_positions
    good = make_group("good")
    produce(kafka, topics.ready, vocabulary + too_long + good)
    config = write_config(tmp_path, namespace, {"engine": {"zero_stage": 0, "lr": 0.01},
                                                "batching": {"experiences": 4, "max_wait_s": 1.0},
                                                "checkpoint_every": 100})
    out = finish(start_trainer(config, "--max-steps", "1"), 240)
    assert "stopped at step 1" in out

    rejected = {r.record_id: r for r in read_all(kafka, topics.rejected, expect=Rejected)}
    assert rejected["oov/2"].reason == "token_out_of_vocabulary" and rejected["oov/2"].stage == "trainer"
    assert "response_tokens: ids [1000000] are outside the model's vocabulary" in rejected["oov/2"].detail
    for e in too_long:
        r = rejected[e.experience_id]
        assert (r.reason, r.stage) == ("forward_failed", "trainer") and "IndexError" in r.detail, r
    # the group missing oov/2 never completes (group_timeout_s) within the one step: not trained, not lost
    assert sorted(rejected) == ["long/0", "long/1", "long/2", "long/3", "oov/2"]
    assert Ledger(tmp_path / "ckpt" / namespace).entries() == [
        {"step": 1, "ids": [e.experience_id for e in good]}]
    (event,) = [m for m in read_all(kafka, topics.metrics, expect=MetricEvent) if m.component == "trainer"
                and "failed_steps" in m.values]
    assert event.values["rejected"] >= 4
