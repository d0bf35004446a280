"""The model rewards of the rollout (rollout/rewards/models.py): the kernel scorers behind the reward contract."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from undertow.kernel.scoring import Item, RewardModelScorer
from undertow.schemas import Task
from undertow.rollout.config import RolloutConfig
from undertow.rollout.rewards import build_reward
from undertow.rollout.rewards.models import NoVerdict
from undertow.rollout.worker import _reason
from tests.scoring_models import JudgeServer, reward_model_dir

TASK = Task(task_id="t", prompt="what is 6*7?", answer="42")


def test_a_reward_model_reward_scores_the_task_prompt_and_the_response(tmp_path):
    rm = reward_model_dir(tmp_path / "rm")
    reward = build_reward({"name": "rollout_reward_model", "path": str(rm)})
    got = reward("42", TASK)
    want = RewardModelScorer(path=rm, cache_size=0).score([Item("what is 6*7?", "42")])[0].value
    assert got == {"reward_model": pytest.approx(want, abs=1e-6)}


def test_a_judge_reward_by_labels_and_its_reasons_when_there_is_no_verdict():
    with JudgeServer(slow_s=3.0) as server:
        # the judge keeps its own deadline (timeout_s): the worker's reward deadline does not cut it shorter
        judge = build_reward({"name": "rollout_llm_judge", "base_url": server.base_url, "model": "judge",
                              "timeout_s": 0.5}, timeout_s=1e-4)
        assert judge("the answer is 42", TASK) == {"llm_judge": pytest.approx(0.75)}  # 0.6 / (0.6 + 0.2)
        with pytest.raises(NoVerdict) as slow:
            judge("slow", TASK)
        regex = build_reward({"name": "rollout_llm_judge", "base_url": server.base_url, "model": "judge",
                              "verdict": "regex"})
        with pytest.raises(NoVerdict) as garbage:
            regex("garbage", TASK)
    # What the worker's rejected record says (rollout/worker.py), for these and for any other failure:
    assert [_reason(slow.value), _reason(garbage.value), _reason(ValueError())] == \
        ["scorer_timeout", "scorer_unparsable", "workflow_error"]


def test_a_missing_model_directory_fails_the_rollout_config_naming_the_field(tmp_path):
    with pytest.raises(ValidationError, match=r"reward 'rollout_reward_model': argument path"):
        RolloutConfig(reward={"name": "rollout_reward_model", "path": str(tmp_path / "missing")})
