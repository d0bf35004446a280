"""clean, score and prioritize with hand-worked numbers."""

import math

import pytest

from undertow.processors import Harness
from undertow.processors.pipeline import Pipeline
from tests.helpers import exp, group

P = "tests.processors.plugins"


def test_clean_checks_each_name_its_reason():
    h = Harness([{"name": "clean", "truncated": "drop", "min_response_tokens": 2, "max_response_tokens": 5}])
    bad_reward = exp("n", 0, 1)
    bad_reward.reward = math.inf  # a stage may set it without validation
    h.feed([exp("e", 0, 1, tokens=0, text=""), exp("t", 0, 1, finish="length"), exp("s", 0, 1, tokens=1),
            exp("l", 0, 1, tokens=6), bad_reward, exp("ok", 0, 1)])
    assert [r for _, r in h.reasons()] == ["empty", "truncated", "too_short", "too_long", "non_finite"]
    assert [e.experience_id for e in h.ready] == ["ok/0"]


def test_clean_keeps_truncated_by_default_and_dedupes_within_the_window():
    h = Harness([{"name": "clean", "dedupe_window_s": 10}])
    h.feed([exp("a", 0, 1, finish="length")])
    h.feed([exp("a", 0, 1, finish="length")])  # redelivered
    h.advance(11)
    h.feed([exp("a", 0, 1, finish="length")])  # outside the window: kept again
    assert len(h.ready) == 2 and h.reasons() == [("clean", "duplicate")]


def test_dedupe_by_response_and_its_memory_is_bounded():
    h = Harness([{"name": "clean", "dedupe": "response", "dedupe_max_entries": 3}])
    h.feed([exp("a", 0, 2, text="same"), exp("a", 1, 2, text="same")])
    assert h.reasons() == [("clean", "duplicate")]
    h.feed([exp(f"x{i}", 0, 1, text=f"t{i}") for i in range(10)])
    assert len(h.pipeline.context.store("dedupe")) == 3


def test_score_adds_components_and_scores_unscored():
    h = Harness([{"name": "score", "scores": [{"name": "format_bonus", "pattern": "ANSWER", "weight": 0.5},
                                               {"name": "length_bonus", "target_tokens": 4, "weight": 1.0}]}])
    h.feed([exp("a", 0, 1, reward=None, text="ANSWER 4", tokens=2), exp("b", 0, 1, reward=1.0, text="no", tokens=4)])
    a, b = h.ready
    assert a.reward_components == {"format_bonus": 0.5, "length_bonus": -0.5}  # -1 * |2 - 4| / 4
    assert a.reward == pytest.approx(0.0)
    assert b.reward == pytest.approx(1.0) and b.reward_components == {"format_bonus": 0.0, "length_bonus": 0.0}


def test_no_stream_score_shares_a_name_with_a_rollout_reward():
    """One name, one contract: `fn(exp)` in the stream, `fn(response, task)` in the rollout."""
    from undertow.processors.score import STREAM_SCORES
    from undertow.rollout.rewards import rewards

    assert STREAM_SCORES.names() and rewards.names()
    assert not set(STREAM_SCORES.names()) & set(rewards.names())


def test_the_scorer_hook_is_called_in_batches():
    from tests.processors import plugins

    plugins.length_scorer.calls.clear()
    h = Harness([{"name": "score", "scorer": f"{P}.length_scorer", "batch_size": 4}])
    h.feed([exp(f"g{i}", 0, 1, reward=None, text="x" * i) for i in range(10)])
    assert plugins.length_scorer.calls == [4, 4, 2]
    assert [e.reward for e in h.ready] == pytest.approx([i / 10 for i in range(10)])


def test_prioritize_formula_and_task_stats():
    pipeline = [{"name": "reshape", "advantage": "dr_grpo"},
                {"name": "prioritize", "advantage_weight": 1.0, "freshness_weight": 0.5, "difficulty_weight": 2.0,
                 "floor": 0.0, "success_threshold": 1.0}]
    h = Harness(pipeline)
    h.feed(group("a", [1.0, 0.0], version=2))
    h.feed(group("b", [1.0, 1.0, 1.0, 0.0], version=4))
    a0, a1 = h.ready[:2]
    # a: |A| = 0.5, freshness 1/(1+2-2) = 1, pass rate 1/2 -> 0.5 + 0.5*1 + 2*0.5 = 2.0
    assert a0.priority == pytest.approx(2.0) and a1.priority == pytest.approx(2.0)
    b3 = h.ready[5]
    # b: mean 0.75, |A| of sample 3 = 0.75, freshness 1, pass rate 3/4 -> 0.75 + 0.5 + 0.5 = 1.75
    assert b3.priority == pytest.approx(1.75)
    stats = {s.task_id: (s.attempts, s.successes) for s in h.out.task_stats}
    assert stats == {"a": (2, 1), "b": (4, 3)}


def test_a_user_formula_by_dotted_path():
    h = Harness(["reshape", {"name": "prioritize", "formula": "builtins.max"}])
    h.feed(group("a", [1.0, 0.0]))
    assert [e.priority for e in h.ready] == pytest.approx([1.0, 1.0])  # max(|A|=0.707, freshness 1, difficulty .5)


def test_default_pipeline_builds():
    from undertow.processors.config import ProcessorsConfig

    assert [s.name for s in Pipeline.from_config(ProcessorsConfig().pipeline).stages] == ["clean", "reshape", "prioritize"]
