"""Engine, workflows, experiences: log-probs agree with a trainer-style recomputation; masks are right."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from undertow.kernel.models import ModelSpec, build_model, weights_to_bytes
from undertow.schemas import Experience, Task, encode, decode
from undertow.schemas.logprobs import sequence_logprobs
from undertow.rollout.engines import SamplingParams, build_engine
from undertow.rollout.experiences import to_experiences
from undertow.rollout.rewards import build_reward
from undertow.rollout.workflows import WorkflowContext, build_workflow
from undertow.rollout.workflows.number_guess import NumberGuess


@pytest.fixture(scope="module")
def engine():
    return build_engine({"name": "transformers", "batch_size": 4, "seed": 0}, ModelSpec())


def trainer_logprobs(spec: ModelSpec, exps: list[Experience], temperature: float) -> list[list[float]]:
    """What a trainer does: its own model from the spec, a right-padded batch, schemas.logprobs."""
    model = build_model(spec)
    seqs = [e.prompt_tokens + e.response_tokens for e in exps]
    width = max(map(len, seqs))
    ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    with torch.no_grad():
        lp = sequence_logprobs(model, ids, mask, temperature)  # [B, T-1]
    return [lp[i, len(e.prompt_tokens) - 1:len(seqs[i]) - 1].tolist() for i, e in enumerate(exps)]


def test_behaviour_logprobs_match_trainer_recomputation(engine):
    params = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=24)
    ctx = WorkflowContext(engine=engine, sampling=params, reward=build_reward("numeric_match"))
    tasks = [Task(task_id=f"t{i}", prompt=p, answer="5", group_size=3)
             for i, p in enumerate(["What is 2+3?", "Add 1 and 4, then say it twice please"])]
    exps = [e for t in tasks for e in to_experiences(t, build_workflow("single_turn")(t, ctx),
                                                     policy_version=0, worker="w")]
    assert len(exps) == 6 and len({len(e.prompt_tokens) for e in exps}) == 2  # padding really happened
    recomputed = trainer_logprobs(ModelSpec(), exps, 0.7)
    worst = max(abs(a - b) for e, r in zip(exps, recomputed) for a, b in zip(e.behaviour_logprobs, r))
    assert worst <= 1e-4
    for e in exps:
        assert len(e.response_tokens) == len(e.behaviour_logprobs) == len(e.loss_mask) > 0
        assert decode(encode(e), expect=Experience) == e  # valid on the wire


def test_wrong_temperature_would_be_caught(engine):
    """The check above can fail: the same tokens scored at another temperature differ by far more."""
    params = SamplingParams(temperature=0.7, max_new_tokens=16)
    ctx = WorkflowContext(engine=engine, sampling=params, reward=build_reward("numeric_match"))
    task = Task(task_id="t", prompt="What is 2+3?", group_size=1)
    exp = to_experiences(task, build_workflow("single_turn")(task, ctx), policy_version=0, worker="w")[0]
    other = trainer_logprobs(ModelSpec(), [exp], 1.0)[0]
    assert max(abs(a - b) for a, b in zip(exp.behaviour_logprobs, other)) > 1e-2


def test_generation_stops_at_eos_or_length_and_fits_the_context(engine):
    samples = engine.generate([[5, 6, 7]], 8, SamplingParams(max_new_tokens=40))[0]
    eos = engine.tokenizer.eos_token_id
    for s in samples:
        if s.finish_reason == "stop":
            assert s.tokens[-1] == eos and eos not in s.tokens[:-1]
        else:
            assert len(s.tokens) == 40 and eos not in s.tokens
    long_prompt = [5] * 250  # the tiny model has 256 positions
    assert len(engine.generate([long_prompt], 1, SamplingParams(max_new_tokens=40))[0][0].tokens) <= 6


def test_load_weights_changes_samples_in_place(engine):
    before = engine.logprobs([5, 6], [7, 8], 1.0)
    engine.load_weights(weights_to_bytes(build_model(ModelSpec(seed=9))))
    after = engine.logprobs([5, 6], [7, 8], 1.0)
    engine.load_weights(weights_to_bytes(build_model(ModelSpec())))
    assert after != pytest.approx(before, abs=1e-3)
    assert engine.logprobs([5, 6], [7, 8], 1.0) == pytest.approx(before, abs=1e-6)


def test_number_guess_needs_several_turns_hand_worked():
    env = NumberGuess(low=1, high=100, step_penalty=0.1)
    assert "between 1 and 100" in env.reset(Task(task_id="g", prompt="", answer="37", messages=[
        {"role": "user", "content": "x"}]))
    assert env.step("50").observation == "lower"
    assert env.step("I say 25").observation == "higher"
    result = env.step("hmm")
    assert (result.observation, result.reward, result.done) == ("Answer with one number.", -0.1, False)
    assert env.step("37") == env.step("37")  # idempotent once found
    assert env.step("37").done and env.step("37").reward == 1.0


def test_multi_turn_masks_and_logprobs(engine):
    params = SamplingParams(temperature=1.0, max_new_tokens=6)
    ctx = WorkflowContext(engine=engine, sampling=params, reward=build_reward("numeric_match"))
    task = Task(task_id="g", prompt="Guess my number between 1 and 9.", answer="100", group_size=2)
    workflow = build_workflow({"name": "multi_turn", "max_turns": 3,
                               "environment": {"name": "number_guess", "low": 1, "high": 200}})
    trajectories = workflow(task, ctx)
    exps = to_experiences(task, trajectories, policy_version=0, worker="w")
    tok = engine.tokenizer
    for t, e in zip(trajectories, exps):
        assert t.metadata["turns"] == 3  # the random tiny model does not find 100 in three guesses
        assert len(e.loss_mask) == len(e.response_tokens) == len(e.behaviour_logprobs)
        # Exactly the observation tokens carry mask 0, and they spell the feedback.
        observed = tok.decode([tk for tk, m in zip(e.response_tokens, e.loss_mask) if m == 0])
        assert observed.count("\nuser: ") == 2 and observed.count("\nassistant: ") == 2
        assert sum(e.loss_mask) == len(e.response_tokens) - len(tok(observed)["input_ids"])
        assert e.loss_mask[0] == 1 and e.loss_mask[-1] == 1  # starts and ends with a policy turn
    # The policy's tokens carry the log-probs they were sampled with, as the trainer computes them; the
    # observations' are never read (mask 0) and recorded as 0.
    recomputed = trainer_logprobs(ModelSpec(), exps, 1.0)
    pairs = [(a, b, m) for e, r in zip(exps, recomputed) for a, b, m in zip(e.behaviour_logprobs, r, e.loss_mask)]
    assert max(abs(a - b) for a, b, m in pairs if m == 1) <= 1e-4
    assert all(a == 0.0 for a, _, m in pairs if m == 0)


def test_multi_turn_custom_environment_reward_and_done(engine):
    ctx = WorkflowContext(engine=engine, sampling=SamplingParams(max_new_tokens=4), reward=build_reward("format"))
    workflow = build_workflow({"name": "multi_turn", "environment": {"name": "tests.rollout.plugins.Echo", "turns": 2}})
    [t] = workflow(Task(task_id="e", prompt="x"), ctx)
    assert t.metadata["turns"] == 2 and t.finish_reason == "stop"
    assert t.reward_components == {"env": 1.0, "format": 0.0}
    assert t.loss_mask.count(0) == len(engine.tokenizer("\nuser: again\nassistant: ")["input_ids"])


def test_experience_ids_are_deterministic_and_group_size_is_checked(engine):
    ctx = WorkflowContext(engine=engine, sampling=SamplingParams(), reward=build_reward("numeric_match"))
    task = Task(task_id="arith/3@7", prompt="1+1", answer="2", group_size=2)
    flow = build_workflow({"name": "tests.rollout.plugins.constant_workflow", "text": "2"})
    exps = to_experiences(task, flow(task, ctx), policy_version=4, worker="w", generated_at=5.0)
    assert [e.experience_id for e in exps] == ["arith/3@7/0", "arith/3@7/1"]
    assert {e.group_id for e in exps} == {"arith/3@7"} and exps[0].reward == 1.0
    assert exps[0].timestamps == {"created": task.created_at, "generated": 5.0} and exps[0].policy_version == 4
    with pytest.raises(ValueError, match="group_size"):
        to_experiences(task.model_copy(update={"group_size": 3}), flow(task, ctx), policy_version=0, worker="w")


def test_each_token_gets_its_policy_version(engine):
    """The transformers engine says nothing per token: every token is of the version held (4). A
    trajectory whose tokens span a swap (versions 4, 5, 5: what the async vLLM engine records) keeps
    them, and its policy_version is the oldest, 4, even when the worker now holds 5."""
    ctx = WorkflowContext(engine=engine, sampling=SamplingParams(max_new_tokens=3), reward=build_reward("numeric_match"))
    task = Task(task_id="v", prompt="1+1", answer="2", group_size=2)
    plain = build_workflow("single_turn")(task, ctx)
    exps = to_experiences(task, plain, policy_version=4, worker="w")
    assert [e.token_versions for e in exps] == [[4] * e.num_response_tokens for e in exps]
    spanning = [replace(plain[0], response_tokens=[1, 2, 3], logprobs=[-1.0] * 3, loss_mask=[1] * 3,
                        versions=[4, 5, 5]), plain[1]]
    first = to_experiences(task, spanning, policy_version=5, worker="w")[0]
    assert (first.token_versions, first.policy_version) == ([4, 5, 5], 4)
    assert decode(encode(first)) == first


def test_reference_workflow_emits_the_answer_with_policy_logprobs(engine):
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    ctx = WorkflowContext(engine=engine, sampling=params, reward=build_reward("numeric_match"))
    task = Task(task_id="r1", prompt="12+7=", answer="19", group_size=2)
    trajectories = build_workflow("reference")(task, ctx)
    tok = engine.tokenizer
    assert len(trajectories) == 2
    t = trajectories[0]
    assert t.response_tokens == tok("19", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert t.reward_components == {"correct": 1.0}
    exps = to_experiences(task, trajectories, policy_version=0, worker="w")
    assert trainer_logprobs(ModelSpec(), exps[:1], 1.0)[0] == pytest.approx(exps[0].behaviour_logprobs, abs=1e-4)
    with pytest.raises(ValueError, match="needs task.answer"):
        build_workflow("reference")(Task(task_id="r2", prompt="hi"), ctx)


def test_answers_without_logprobs_are_the_same_answers_and_skip_the_scoring_pass(engine, monkeypatch):
    """Evaluation asks for no log-probs: the same greedy answers, and no forward pass to score them."""
    prompts = [engine.tokenizer("What is 2+3?")["input_ids"], engine.tokenizer("Say 7")["input_ids"]]
    scored = engine.generate(prompts, 2, SamplingParams(max_new_tokens=8, greedy=True))
    monkeypatch.setattr(type(engine), "_score", lambda *a: pytest.fail("scored answers nobody asked log-probs of"))
    plain = engine.generate(prompts, 2, SamplingParams(max_new_tokens=8, greedy=True, logprobs=False))
    assert [[s.tokens for s in g] for g in plain] == [[s.tokens for s in g] for g in scored]
    assert all(s.logprobs == [] and len(s.tokens) > 0 for g in plain for s in g)
    assert all(len(s.logprobs) == len(s.tokens) for g in scored for s in g)
