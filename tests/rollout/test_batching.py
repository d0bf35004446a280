"""Batched workflows without a broker: a batch of single-turn tasks is one engine call, each task gets
its own samples back, and one bad task fails alone. (The worker through the broker: test_worker_broker.py.)"""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from undertow.kernel.models.tiny import char_tokenizer
from undertow.schemas import Task
from undertow.rollout.admission import Admission
from undertow.rollout.config import RolloutConfig
from undertow.rollout.engines import SamplingParams
from undertow.rollout.engines.base import Sample
from undertow.rollout.workflows import WorkflowContext, build_batch_workflow, build_workflow


class EchoEngine:
    """Answers every prompt with its own text: which task a sample went to is visible in it."""

    max_length = None

    def __init__(self, refuse_longer_than: int = 1000):
        self.tokenizer = char_tokenizer()
        self.calls: list[tuple[int, int]] = []  # (prompts, n) of each generate()
        self.refuse_longer_than = refuse_longer_than

    def generate(self, prompts, n, params):
        self.calls.append((len(prompts), n))
        if any(len(p) > self.refuse_longer_than for p in prompts):
            raise ValueError("prompt too long")
        return [[Sample(tokens=list(p), text=self.tokenizer.decode(p), logprobs=[-1.0] * len(p), finish_reason="stop")
                 for _ in range(n)] for p in prompts]

    def logprobs(self, prompt, continuation, temperature):
        return [-1.0] * len(continuation)


def echo_reward(text: str, task: Task) -> dict[str, float]:
    if task.answer == "boom":
        raise ValueError("this reward cannot score this task")
    return {"own_prompt": float(text == task.prompt)}


def ctx_of(engine: EchoEngine) -> WorkflowContext:
    return WorkflowContext(engine=engine, sampling=SamplingParams(), reward=echo_reward, chat_template=False)


def tasks(*sizes: int, **kw) -> list[Task]:
    return [Task(task_id=f"t{i}", prompt=f"{i}+{i}=" + "x" * i, answer="0", group_size=n, **kw)
            for i, n in enumerate(sizes)]


def test_single_turn_tasks_go_to_the_engine_in_one_call_and_keep_their_own_samples():
    engine = EchoEngine()
    batch = tasks(4, 4, 4, 4, 4)
    outcomes = build_batch_workflow("single_turn")(batch, ctx_of(engine))
    assert engine.calls == [(5, 4)]  # one call for five tasks, not five
    assert [len(o) for o in outcomes] == [4] * 5
    assert all(t.reward_components == {"own_prompt": 1.0} for o in outcomes for t in o)
    assert [o[0].prompt_text for o in outcomes] == [t.prompt for t in batch]


def test_group_sizes_that_differ_make_one_call_per_size():
    engine = EchoEngine()
    outcomes = build_batch_workflow("single_turn")(tasks(2, 3, 2), ctx_of(engine))
    assert sorted(engine.calls) == [(1, 3), (2, 2)]
    assert [len(o) for o in outcomes] == [2, 3, 2]
    assert all(t.reward_components["own_prompt"] == 1.0 for o in outcomes for t in o)


def test_a_task_whose_reward_fails_fails_alone():
    engine = EchoEngine()
    batch = tasks(2, 2, 2)
    batch[1] = batch[1].model_copy(update={"answer": "boom"})
    outcomes = build_batch_workflow("single_turn")(batch, ctx_of(engine))
    assert engine.calls == [(3, 2)]
    assert isinstance(outcomes[1], ValueError) and len(outcomes[0]) == len(outcomes[2]) == 2


def test_a_prompt_the_engine_refuses_fails_alone():
    engine = EchoEngine(refuse_longer_than=5)
    outcomes = build_batch_workflow("single_turn")(tasks(2, 2, 2), ctx_of(engine))  # t2's prompt is 6 characters
    assert engine.calls == [(3, 2), (1, 2), (1, 2), (1, 2)]  # the batch, then task by task
    assert isinstance(outcomes[2], ValueError) and len(outcomes[0]) == len(outcomes[1]) == 2


def test_multi_turn_episodes_of_all_tasks_share_each_turns_engine_call():
    engine = EchoEngine()
    batch = [Task(task_id=f"g{i}", prompt="guess", answer="3", group_size=2) for i in range(2)]
    outcomes = build_batch_workflow({"name": "multi_turn", "environment": "number_guess", "max_turns": 2})(
        batch, ctx_of(engine))
    assert engine.calls == [(4, 1), (4, 1)]  # 2 tasks x 2 samples, two turns: one call per turn
    assert [len(o) for o in outcomes] == [2, 2]
    assert all(t.metadata["turns"] == 2 for o in outcomes for t in o)


def test_workflows_without_a_batched_form_run_task_by_task():
    engine = EchoEngine()
    reference = build_batch_workflow("reference")(tasks(2, 1), ctx_of(engine))
    assert [len(o) for o in reference] == [2, 1] and engine.calls == []  # scored, nothing generated


def test_batch_tasks_is_validated():
    assert RolloutConfig().batch_tasks == 8
    for bad in (0, 1025):
        with pytest.raises(ValidationError, match="batch_tasks"):
            RolloutConfig(batch_tasks=bad)


def test_admission_room_is_what_the_budget_has_left():
    admission = Admission(max_staleness=1, experiences_per_version=4)
    admission.trainer_announced(0)
    assert admission.room() == 8
    admission.published(6)
    assert admission.room() == 2
    admission.published(3)
    assert admission.room() == 0
    admission.trainer_announced(1)
    assert admission.room() == 3  # counted over the run: (1 + 1 + 1) * 4 - 9 (rollout/admission.py)
    assert Admission(max_staleness=1).room() is None


class GreedyKnowsEngine(EchoEngine):
    """Samples echo the prompt; a greedy answer is "greedy": the baseline's reward is visibly its own."""

    def generate(self, prompts, n, params):
        if not params.greedy:
            return super().generate(prompts, n, params)
        self.calls.append((len(prompts), -n))  # a greedy call, told apart by its sign
        assert not params.logprobs  # never trained: no log-probs
        return [[Sample(tokens=[1], text="greedy", logprobs=[], finish_reason="stop")] for _ in prompts]


def greedy_reward(text: str, task: Task) -> dict[str, float]:
    return {"greedy": 0.25 if text == "greedy" else 1.0}


def test_a_greedy_baseline_answer_is_scored_for_each_task_and_never_published():
    engine = GreedyKnowsEngine()
    ctx = WorkflowContext(engine=engine, sampling=SamplingParams(), reward=greedy_reward, chat_template=False,
                          greedy_baseline=True)
    outcomes = build_batch_workflow("single_turn")(tasks(4, 4, 2), ctx)
    assert engine.calls == [(1, 2), (1, -1), (2, 4), (2, -1)]  # per group size: the samples, then one greedy each
    assert [len(o) for o in outcomes] == [4, 4, 2]  # the group, without the greedy answer
    assert all(t.metadata == {"baseline_reward": 0.25} and t.reward_components == {"greedy": 1.0}
               for o in outcomes for t in o)
    one = build_workflow("single_turn")(tasks(3)[0], ctx)
    assert len(one) == 3 and one[0].metadata == {"baseline_reward": 0.25}
    plain = build_batch_workflow("single_turn")(tasks(4), ctx_of(EchoEngine()))
    assert all(t.metadata == {} for t in plain[0])
    with pytest.raises(ValidationError, match="greedy_baseline: workflow reference does not generate"):
        RolloutConfig(workflow="reference", greedy_baseline=True)
