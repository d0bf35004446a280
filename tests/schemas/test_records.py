"""Record helpers: effective mask, pass rate, bounded Rejected."""

import pytest
from pydantic import ValidationError

from undertow.schemas import MAX_ORIGINAL_BYTES, Rejected, TaskStat


def test_mask_is_ones_when_empty(examples):
    exp = examples["experience"]
    assert exp.mask() == [1, 0, 1]
    assert exp.num_response_tokens == 3
    assert exp.model_copy(update={"loss_mask": []}).mask() == [1, 1, 1]


def test_pass_rate():
    assert TaskStat(task_id="t", attempts=8, successes=6).pass_rate == 0.75
    assert TaskStat(task_id="t").pass_rate == 0.0
    with pytest.raises(ValidationError, match="successes\n.*3 > attempts 2"):
        TaskStat(task_id="t", attempts=2, successes=3)


def test_rejected_bounds_original():
    with pytest.raises(ValidationError, match="original"):
        Rejected(stage="clean", reason="too_large", original=b"x" * (MAX_ORIGINAL_BYTES + 1))
    big = b"x" * (MAX_ORIGINAL_BYTES + 10)
    rejected = Rejected.of("clean", "too_large", big, detail="over max", topic="ns.experiences.raw", offset=5)
    assert len(rejected.original) == MAX_ORIGINAL_BYTES
    assert rejected.detail == f"[original cut from {len(big)} bytes] over max"
    assert (rejected.topic, rejected.offset, rejected.partition) == ("ns.experiences.raw", 5, None)
    small = Rejected.of("clean", "stale", b"abc", record_id="e-1")
    assert (small.original, small.detail, small.record_id) == (b"abc", "", "e-1")
