"""The model scorers (kernel/scoring/) on tiny real models saved to disk, and a real HTTP judge endpoint."""

from __future__ import annotations

import time

import pytest
import torch

from undertow.kernel.scoring import TIMEOUT, UNPARSABLE, Item, LLMJudge, RewardModelScorer
from tests.scoring_models import JudgeServer, judge_dir, reward_model_dir

ITEMS = [Item("1+1=?", "2"), Item("what is 6*7?", "6*7 = 42, so 42")]  # two lengths: padding matters


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("scoring")
    return {"rm": reward_model_dir(root / "rm"), "rm2": reward_model_dir(root / "rm2", num_labels=2),
            "judge": judge_dir(root / "judge")}


def test_reward_model_scores_each_conversation_as_its_last_token_logit(models):
    scorer = RewardModelScorer(path=models["rm"], batch_size=2)
    got = [s.value for s in scorer.score(ITEMS)]
    model = scorer.model
    for item, value in zip(ITEMS, got):
        # The tiny chat template, written out: "user: <prompt>\nassistant: <response>\n".
        text = f"user: {item.prompt}\nassistant: {item.response}\n"
        ids = torch.tensor([scorer.tokenizer(text)["input_ids"]])
        with torch.no_grad():
            h = model.transformer(ids).last_hidden_state[0, -1]  # [n_embd]: the unpadded last token
            want = float(h @ model.score.weight[0])  # the one-label head is a linear map without bias
        assert value == pytest.approx(want, abs=1e-5)


def test_a_two_label_reward_model_gives_the_probability_of_the_last_label(models):
    scorer = RewardModelScorer(path=models["rm2"], chat_template=False)
    value = scorer.score([ITEMS[0]])[0].value
    with torch.no_grad():
        logits = scorer.model(**scorer.tokenizer(["1+1=?2"], return_tensors="pt")).logits[0]
    assert value == pytest.approx(float(logits.softmax(-1)[1]), abs=1e-6)


def test_a_local_judge_gives_p_yes_among_the_labels(models):
    judge = LLMJudge(path=models["judge"], rubric="Q: {prompt} A: {response} Ref: {reference}. Right?")
    value = judge.score([Item("1+1=?", "2", "2")])[0].value
    text = "user: Q: 1+1=? A: 2 Ref: 2. Right?\nassistant: "  # the chat template with the generation prompt
    tok, model = judge.backend.tokenizer, judge.backend.model
    with torch.no_grad():
        p = model(torch.tensor([tok(text)["input_ids"]])).logits[0, -1].softmax(-1)  # [V]
    p_yes, p_no = float(p[tok.convert_tokens_to_ids("Y")]), float(p[tok.convert_tokens_to_ids("N")])
    assert value == pytest.approx(p_yes / (p_yes + p_no), abs=1e-5)


def test_a_left_padded_batch_of_judge_prompts_scores_as_each_prompt_alone(models):
    judge = LLMJudge(path=models["judge"], cache_size=0)
    batched = [s.value for s in judge.score(ITEMS)]
    alone = [judge.score([item])[0].value for item in ITEMS]
    assert batched == pytest.approx(alone, abs=1e-5)


def test_a_local_judge_that_writes_no_score_is_unparsable(models):
    judge = LLMJudge(path=models["judge"], verdict="regex", max_new_tokens=8)  # random weights write noise
    verdict = judge.score([Item("1+1=?", "2", "2")])[0]
    assert verdict.value is None and verdict.reason == UNPARSABLE


def test_the_regex_verdict_normalises_the_last_score_and_refuses_one_out_of_range(models):
    judge = LLMJudge(path=models["judge"], verdict="regex", score_range=(1, 5))
    assert judge.parse("Score: 9 ... no, Score: 4").value == pytest.approx(0.75)  # (4 - 1) / (5 - 1)
    assert judge.parse("Score: 6").reason == UNPARSABLE


def test_an_endpoint_judge_by_labels_and_by_regex():
    with JudgeServer() as server:
        labels = LLMJudge(base_url=server.base_url, model="judge")
        # 0.6 / (0.6 + 0.2): "Maybe" is not a label; 0.1 / (0.1 + 0.9). See tests/scoring_models.py.
        assert [s.value for s in labels.score([Item("q", "42"), Item("q", "41")])] == pytest.approx([0.75, 0.1])
        regex = LLMJudge(base_url=server.base_url, model="judge", verdict="regex")
        got = regex.score([Item("q", "42"), Item("q", "41"), Item("q", "garbage")])
        assert [s.value for s in got[:2]] == pytest.approx([0.7, 0.2])  # "Score: 7", "Score: 2" on 0..10
        assert got[2].value is None and got[2].reason == UNPARSABLE


def test_a_judge_past_its_timeout_gives_timeouts_and_the_next_call_goes_on():
    with JudgeServer(slow_s=3.0) as server:
        judge = LLMJudge(base_url=server.base_url, model="judge", batch_size=1, workers=2, timeout_s=0.5)
        got = judge.score([Item("slow", "42"), Item("q", "42")])
        assert got[0].value is None and got[0].reason == TIMEOUT
        assert got[1].value == pytest.approx(0.75)  # its own chunk, on the other worker thread


def test_the_endpoints_own_timeout_firing_first_is_a_timeout_too():
    """The HTTP client's timeout is the scorer's `timeout_s` as well: under load either clock may fire
    first. The client's used to end as an `error` verdict (a rollout reward's reason scorer_error: it
    failed the rollout test once in a CI run). Here the client's clock is made the earlier one."""
    with JudgeServer(slow_s=3.0) as server:
        judge = LLMJudge(base_url=server.base_url, model="judge", batch_size=1, timeout_s=10.0)
        judge.backend.timeout_s = 0.3  # the client waits 0.3 s, the scorer would wait 10
        started = time.monotonic()
        (got,) = judge.score([Item("slow", "42")])
        assert got.value is None and got.reason == TIMEOUT, got
        assert time.monotonic() - started < 3.0  # the client's clock ended it, not the slow answer


def test_verdicts_are_cached_by_content_and_a_new_rubric_is_a_new_version():
    with JudgeServer() as server:
        judge = LLMJudge(base_url=server.base_url, model="judge")
        first = judge.score([Item("q", "42"), Item("q", "41")])
        asked = server.requests
        again = judge.score([Item("q", "41"), Item("q", "42")])
        assert server.requests == asked and judge.cache.hits == 2  # nothing asked twice
        assert [s.value for s in again] == [first[1].value, first[0].value]
        other = LLMJudge(base_url=server.base_url, model="judge", rubric="{response}?")
        assert other.version != judge.version and other.scored_by.startswith("llm_judge@")


def test_the_cache_is_bounded():
    with JudgeServer() as server:
        judge = LLMJudge(base_url=server.base_url, model="judge", cache_size=1)
        judge.score([Item("q", "42"), Item("q", "41")])
        judge.score([Item("q", "42")])  # evicted by "41": asked again
        assert server.requests == 3 and len(judge.cache.data) == 1


def test_the_reward_model_version_follows_the_model_files(models, tmp_path):
    copy = reward_model_dir(tmp_path / "rm", seed=1)  # same files, other weights
    assert RewardModelScorer(path=copy).version != RewardModelScorer(path=models["rm"]).version
    assert RewardModelScorer(path=models["rm"]).version == RewardModelScorer(path=models["rm"]).version


def test_bad_arguments_fail_naming_the_field(tmp_path):
    with pytest.raises(ValueError, match="path"):
        RewardModelScorer(path=tmp_path / "missing")
    with pytest.raises(ValueError, match="path / base_url"):
        LLMJudge()
    with pytest.raises(ValueError, match="model"):
        LLMJudge(base_url="http://127.0.0.1:1/v1")
    with pytest.raises(ValueError, match="pattern"):
        LLMJudge(base_url="http://127.0.0.1:1/v1", model="m", pattern=r"Score: \d+")
