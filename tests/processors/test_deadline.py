"""Processor calls under a deadline (processors/deadline.py): a plugin, a group plugin or a data-juicer op
that hangs costs its record(s) a rejection with reason `timeout`, and the records beside it go on."""

from __future__ import annotations

import time

import data_juicer.ops  # noqa: F401  CI installs it (infra/requirements-nodeps.txt): missing fails, not skips
import pytest

from undertow.processors import Harness
from undertow.processors.config import ProcessorsConfig
from undertow.processors.pipeline import HANGS_PER_BATCH
from tests.helpers import exp
from tests.hostile import processor_plugins

HANG = "tests.hostile.processor_plugins.hang_until_released"
TIMEOUT_S = 0.2


@pytest.fixture(autouse=True)
def release_hung_calls():
    processor_plugins.RELEASE.clear()
    yield
    processor_plugins.RELEASE.set()  # the abandoned threads return and end


def test_a_hanging_plugin_rejects_its_record_with_reason_timeout_and_the_batch_goes_on():
    h = Harness([HANG, "reshape"], stage_timeout_s=TIMEOUT_S)
    t0 = time.monotonic()
    h.feed([exp("a", 0, 1), exp("b", 0, 1, text="hang"), exp("c", 0, 1)])
    # The batch's call times out once, then the records one by one: only "b" hangs again (`hung` below
    # counts the deadlines spent; a hang is forever, so any bound shows that none was waited out).
    assert time.monotonic() - t0 < 30
    assert [e.group_id for e in h.ready] == ["a", "c"]
    assert h.reasons() == [(HANG, "timeout")]
    assert f"processor {HANG!r}: no result within 0.2 s" in h.out.dropped[0].detail
    assert h.out.dropped[0].arrival.experience.group_id == "b"
    assert h.pipeline.deadline.hung == [f"processor {HANG!r}"] * 2  # the batch's call and b's own
    h.feed([exp("d", 0, 1)])  # a new helper thread takes the next calls
    assert [e.group_id for e in h.ready] == ["a", "c", "d"]


def test_the_same_record_after_a_restart_is_rejected_again_not_hung_on():
    """A restarted worker reads an uncommitted hanging record again: a fresh pipeline rejects it again."""
    for _ in range(2):
        h = Harness([HANG, "reshape"], stage_timeout_s=TIMEOUT_S)
        h.feed([exp("b", 0, 1, text="hang"), exp("c", 0, 1)], batch_size=1)
        assert (h.reasons(), [e.group_id for e in h.ready]) == ([(HANG, "timeout")], ["c"])


def test_a_batch_tries_at_most_a_few_hanging_records_then_rejects_the_rest_untried():
    """Each hang costs a deadline: a batch full of them must not outlast the worker's watchdog."""
    h = Harness([HANG], stage_timeout_s=TIMEOUT_S)
    hanging = [exp(f"h{i}", 0, 1, text="hang") for i in range(6)]
    t0 = time.monotonic()
    h.feed([exp("a", 0, 1), *hanging])
    assert time.monotonic() - t0 < 30  # hangs are forever: the deadlines were not waited out
    assert [e.group_id for e in h.ready] == ["a"] and h.reasons() == [(HANG, "timeout")] * 6
    untried = [d.detail for d in h.out.dropped[HANGS_PER_BATCH:]]
    assert untried == [f"not tried: {HANGS_PER_BATCH} earlier records of its batch hung {HANG!r}"] * 3
    assert len(h.pipeline.deadline.hung) == 1 + HANGS_PER_BATCH


def test_a_hanging_group_plugin_rejects_the_group():
    h = Harness(["reshape", "tests.hostile.processor_plugins.GroupHang"], stage_timeout_s=TIMEOUT_S)
    h.feed([exp("g", 0, 2, text="group-hang"), exp("g", 1, 2), exp("k", 0, 1)])
    assert [e.group_id for e in h.ready] == ["k"]
    assert h.reasons() == [("tests.hostile.processor_plugins.GroupHang", "timeout")] * 2


def test_a_hanging_datajuicer_op_is_named_in_the_timeout():
    op = processor_plugins.register_hanging_datajuicer_op()
    h = Harness([{"name": "data_juicer", "ops": [{"text_length_filter": {"min_len": 1}}, {op: {}}]}],
                stage_timeout_s=TIMEOUT_S)
    h.feed([exp("a", 0, 1), exp("b", 0, 1, text="hang")])
    assert [e.group_id for e in h.ready] == ["a"] and h.reasons() == [("data_juicer", "timeout")]
    assert h.out.dropped[0].detail.endswith(f"(in data-juicer op {op!r})")


def test_too_many_hung_calls_ask_for_a_restart():
    h = Harness([HANG], stage_timeout_s=TIMEOUT_S, max_hung_calls=2)
    h.feed([exp("b", 0, 1, text="hang")])
    assert h.pipeline.wedged() is None
    h.feed([exp("c", 0, 1, text="hang")])
    assert h.pipeline.wedged() == f"2 processor calls hang past their 0.2 s deadline (last: processor {HANG!r})"


def test_a_deadline_the_watchdog_could_not_wait_for_is_refused():
    with pytest.raises(ValueError, match="stage_timeout_s: 20 s is too long for stall_timeout_s 120 s"):
        ProcessorsConfig(stage_timeout_s=20.0)
    assert ProcessorsConfig(stage_timeout_s=None, stall_timeout_s=1.0).stage_timeout_s is None


def test_only_stages_running_user_code_pay_for_the_deadline():
    """A thread hop per group cost up to a third of a plain pipeline's throughput: built-ins run directly."""
    h = Harness(["clean", "reshape", "prioritize", "score", HANG,
                 {"name": "score", "scores": ["tests.processors.plugins.explode_on"]}], stage_timeout_s=TIMEOUT_S)
    assert [getattr(s.impl, "bounded", False) for s in h.pipeline.stages] == [True, True, True, True, False, False]
