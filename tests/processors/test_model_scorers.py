"""The `score` stage with the model scorers (processors/scorers.py), driven by the no-broker harness."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from undertow.kernel.scoring import Item, LLMJudge, RewardModelScorer
from undertow.processors import Harness
from undertow.processors.config import ProcessorsConfig
from tests.helpers import exp
from tests.scoring_models import JudgeServer, reward_model_dir


@pytest.fixture(scope="module")
def rm(tmp_path_factory):
    return reward_model_dir(tmp_path_factory.mktemp("rm") / "rm")


def test_a_reward_model_scores_each_experience_and_records_its_version(rm):
    exps = [exp("g", i, 2, None, text=t) for i, t in enumerate(["2", "42 it is"])]
    h = Harness([{"name": "score", "scorer": {"name": "reward_model", "path": str(rm)}}])
    h.feed(exps)
    # The same model asked directly (kernel scorer, no processors), on the experiences' texts:
    direct = RewardModelScorer(path=rm, cache_size=0)
    want = [s.value for s in direct.score([Item("p", "2"), Item("p", "42 it is")])]
    assert [e.reward_components["reward_model"] for e in h.ready] == pytest.approx(want, abs=1e-6)
    assert [e.reward for e in h.ready] == pytest.approx(want, abs=1e-6)  # unscored before: the component is the reward
    assert [e.metadata["scored_by"] for e in h.ready] == [[direct.scored_by]] * 2
    assert direct.scored_by.startswith("reward_model@")


def test_a_judge_that_times_out_or_answers_no_score_sends_the_record_to_rejected():
    with JudgeServer(slow_s=3.0) as server:
        scorer = {"name": "llm_judge", "base_url": server.base_url, "model": "judge", "verdict": "regex",
                  "batch_size": 1, "workers": 3, "timeout_s": 0.5}
        h = Harness([{"name": "score", "scorer": scorer, "overwrite": True}])
        texts = ["42", "slow 42", "garbage"]
        h.feed([exp("g", i, 3, 0.0, text=t) for i, t in enumerate(texts)])
    assert [e.response_text for e in h.ready] == ["42"]
    assert h.ready[0].reward == pytest.approx(0.7)  # "Score: 7" on 0..10, replacing the reward 0
    judge = LLMJudge(base_url=server.base_url, model="judge", verdict="regex")
    assert h.ready[0].metadata["scored_by"] == [judge.scored_by]
    assert h.reasons() == [("score", "scorer_timeout"), ("score", "scorer_unparsable")]
    assert "no score" in h.out.dropped[1].detail


def test_a_missing_model_directory_fails_the_config_naming_the_field(tmp_path):
    with pytest.raises(ValidationError, match=r"argument path = .*missing"):
        scorer = {"name": "reward_model", "path": str(tmp_path / "missing")}
        ProcessorsConfig(pipeline=[{"name": "score", "scorer": scorer}])
    with pytest.raises(ValidationError, match=r"path / base_url"):
        ProcessorsConfig(pipeline=[{"name": "score", "scorer": {"name": "llm_judge"}}])
