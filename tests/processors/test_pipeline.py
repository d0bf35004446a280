"""The pure pipeline through the no-broker harness: order, groups, timeouts, plugins, errors."""

import pytest

from undertow.processors import Harness
from undertow.kernel.registry import RegistryError
from tests.helpers import exp, group

P = "tests.processors.plugins"


def test_groups_assemble_out_of_order_and_interleaved():
    h = Harness([{"name": "reshape", "advantage": "dr_grpo"}])
    a, b = group("a", [1.0, 0.0, 0.0, 0.0]), group("b", [2.0, 4.0])
    h.feed([a[3], b[1], a[0]])
    assert h.ready == []
    h.feed([a[2], b[0]])  # b completes
    assert [e.experience_id for e in h.ready] == ["b/0", "b/1"]
    h.feed([a[1]])
    by_id = {e.experience_id: e for e in h.ready}
    assert by_id["a/0"].advantages == [0.75] * 3 and by_id["a/1"].advantages == [-0.25] * 3
    assert by_id["b/0"].advantages == [-1.0] * 3
    assert all("processed" in e.timestamps for e in h.ready)


def test_timeout_emits_partial_or_rejects():
    h = Harness(["reshape"], group_timeout_s=10)
    h.feed(group("a", [1.0, 0.0, 0.5])[:2])
    assert h.advance(9).ready == []
    assert [a.experience.experience_id for a in h.advance(2).ready] == ["a/0", "a/1"]
    h = Harness(["reshape"], group_timeout_s=10, on_timeout="reject")
    h.feed(group("a", [1.0, 0.0, 0.5])[:2])
    h.advance(11)
    assert h.ready == [] and h.reasons() == [("assemble", "group_timeout")] * 2


def test_open_groups_are_bounded():
    h = Harness(["reshape"], max_open_groups=10)
    for i in range(50):
        h.feed([exp(f"g{i}", 0, size=2)])
    h.advance(0)
    assert len(h.pipeline.groups) == 10 and len(h.ready) == 40


def test_a_dropped_sample_still_completes_its_group():
    h = Harness(["clean", "reshape"])
    g = group("a", [1.0, 0.0, 1.0])
    g[1] = exp("a", 1, 3, 0.0, text="   ")
    h.feed(g)
    assert [e.experience_id for e in h.ready] == ["a/0", "a/2"]
    assert h.reasons() == [("clean", "empty")]


def test_a_late_sample_of_a_closed_group_opens_no_phantom_group():
    h = Harness(["clean", "reshape"], group_timeout_s=10)
    a = group("a", [1.0, 0.0])
    h.feed(a)
    h.feed([exp("a", 1, 2, 0.5, text="a regenerated answer"), a[0]])  # redelivered: new content, then a copy
    h.advance(11)
    assert [e.experience_id for e in h.ready] == ["a/0", "a/1"] and len(h.pipeline.groups) == 0
    assert sorted(h.reasons()) == [("assemble", "late_sample"), ("clean", "duplicate")]


def test_zero_variance_groups_are_dropped_by_dynamic_sampling():
    h = Harness([{"name": "reshape", "dynamic_sampling": True}])
    h.feed(group("same", [1.0, 1.0, 1.0]) + group("mixed", [1.0, 0.0]))
    assert {e.group_id for e in h.ready} == {"mixed"}
    assert h.reasons() == [("reshape", "zero_variance")] * 3


def test_unscored_groups_are_rejected_by_reshape():
    h = Harness(["reshape"])
    h.feed(group("u", [None, 1.0]))
    assert h.reasons() == [("reshape", "unscored")] * 2


def test_plugins_by_dotted_path_and_short_name_change_the_stream():
    h = Harness([f"{P}.shout", {"name": f"{P}.drop_containing", "word": "BAD"}, {"name": "test_shout", "suffix": "?"}])
    h.feed([exp("a", 0, 1, text="fine"), exp("b", 0, 1, text="bad")])
    assert [e.response_text for e in h.ready] == ["FINE!?"]
    assert h.reasons() == [("tests.processors.plugins.drop_containing", "forbidden_word")]


def test_a_raising_plugin_rejects_only_its_record_and_the_stream_goes_on():
    h = Harness([f"{P}.explode_on", f"{P}.vanish"])
    h.feed([exp("a", 0, 1, text="boom"), exp("b", 0, 1, text="calm")])
    assert [(d.stage, d.reason) for d in h.out.dropped] == [(f"{P}.explode_on", "error"), (f"{P}.vanish", "dropped")]
    assert "ValueError: cannot handle this one" in h.out.dropped[0].detail


def test_a_group_plugin_placed_after_reshape():
    h = Harness(["reshape", {"name": f"{P}.KeepBest", "k": 1}])
    h.feed(group("a", [0.0, 3.0, 1.0]))
    assert [e.experience_id for e in h.ready] == ["a/1"]


def test_unknown_processors_and_arguments_are_named():
    with pytest.raises(RegistryError, match="nope"):
        Harness(["nope"])
    with pytest.raises(RegistryError, match="unexpected argument"):
        Harness([{"name": "clean", "colour": "red"}])


def test_stage_counters():
    h = Harness(["clean", {"name": "reshape", "dynamic_sampling": True}])
    h.feed(group("a", [1.0, 1.0]) + [exp("b", 0, 1, text="", tokens=0)] + group("c", [1.0, 0.0]))
    v = h.pipeline.stats.values()
    assert (v["clean.in"], v["clean.out"], v["clean.dropped.empty"]) == (5, 4, 1)
    assert (v["reshape.in"], v["reshape.out"], v["reshape.dropped.zero_variance"]) == (4, 2, 2)
    assert v["open_groups"] == 0


def test_a_stage_latency_is_its_time_per_record():
    h = Harness(["clean", {"name": f"{P}.dawdle", "seconds": 0.02}])
    h.feed([exp("a", 0, 1), exp("b", 0, 1), exp("c", 0, 1)])
    v = h.pipeline.stats.values()
    assert 20 <= v[f"{P}.dawdle.latency_ms"] < 200 and v["clean.latency_ms"] < v[f"{P}.dawdle.latency_ms"]
