"""One reward contract per registry, and no name shared between them: a config's `reward_model` or
`format` names one thing, whichever section it is written in."""

from __future__ import annotations

from itertools import combinations

import undertow.processors.builtins  # noqa: F401 — fills the processors' registries
from undertow.processors.score import SCORERS, STREAM_SCORES
from undertow.rollout.rewards import rewards


def test_no_two_registered_rewards_or_scores_share_a_name():
    registries = {"rollout rewards": rewards, "stream scores": STREAM_SCORES, "scorers": SCORERS}
    for (a, ra), (b, rb) in combinations(registries.items(), 2):
        assert not set(ra.names()) & set(rb.names()), f"{a} and {b} share {set(ra.names()) & set(rb.names())}"
    # The model scorers are there on both sides, under their own names.
    assert {"reward_model", "llm_judge"} <= set(SCORERS.names())
    assert {"rollout_reward_model", "rollout_llm_judge"} <= set(rewards.names())
