"""`undertow retrain`'s bookkeeping, broker-free: which steps and records a retrain needs, what it
refuses, and a weights hash that sees one changed bit. The bit-identical retrain itself runs on the
demo's run directory (tests/e2e/test_loop.py, the README's command)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from undertow.trainer.retrain import steps_to_retrain, tag, weights_sha256


def checkpoints(root, steps, ledger):
    for step in steps:
        (root / tag(step)).mkdir(parents=True)
    (root / "ledger.jsonl").write_text("".join(json.dumps({"step": s, "ids": ids}) + "\n" for s, ids in ledger))


def test_the_ledger_gives_each_step_its_records(tmp_path):
    checkpoints(tmp_path, [2, 4], [(1, ["a"]), (2, ["b"]), (3, ["c", "d"]), (4, ["e"]), (5, ["f"])])
    assert steps_to_retrain(tmp_path, 2, 4) == {3: ["c", "d"], 4: ["e"]}


def test_a_step_that_reused_records_is_retrained_on_them_after_its_fresh_ones(tmp_path):
    """The trainer's step order is fresh records, then the replayed ones (trainer/runner.py)."""
    checkpoints(tmp_path, [1, 2], [(1, ["a", "b"])])
    with (tmp_path / "ledger.jsonl").open("a") as f:
        f.write(json.dumps({"step": 2, "ids": ["c"], "reused": ["a"]}) + "\n")
    assert steps_to_retrain(tmp_path, 1, 2) == {2: ["c", "a"]}


def test_a_missing_checkpoint_or_ledger_step_is_refused_with_what_there_is(tmp_path):
    checkpoints(tmp_path, [2, 4], [(3, ["c"])])
    with pytest.raises(ValueError, match=r"no checkpoint of step 3 .*kept: \['step-00000002', 'step-00000004'\]"):
        steps_to_retrain(tmp_path, 2, 3)
    with pytest.raises(ValueError, match=r"no entry for step\(s\) \[4\]"):
        steps_to_retrain(tmp_path, 2, 4)
    with pytest.raises(ValueError, match="must be after"):
        steps_to_retrain(tmp_path, 4, 2)


def test_the_weights_hash_sees_one_bit_and_not_the_file_layout(tmp_path):
    weights = {"b": torch.arange(6, dtype=torch.float32), "a": torch.ones(2, 3)}
    for name, tensors in (("one", weights), ("split", None), ("flipped", None)):
        (tmp_path / name).mkdir()
    save_file(weights, str(tmp_path / "one" / "model.safetensors"))
    save_file({"b": weights["b"]}, str(tmp_path / "split" / "model-00001.safetensors"))  # b first this time
    save_file({"a": weights["a"]}, str(tmp_path / "split" / "model-00002.safetensors"))
    flipped = weights["b"].clone()
    flipped.view(torch.int32)[3] ^= 1  # the lowest mantissa bit of one number
    save_file({"a": weights["a"], "b": flipped}, str(tmp_path / "flipped" / "model.safetensors"))
    assert weights_sha256(tmp_path / "one") == weights_sha256(tmp_path / "split")
    assert weights_sha256(tmp_path / "one") != weights_sha256(tmp_path / "flipped")
