"""Single turn: prompt → response → reward, for each sample of the group; many tasks in one engine call.

With `ctx.greedy_baseline` (rollout.greedy_baseline), each task also gets one greedy answer, scored
by the same reward and never published: its reward rides in every sample's metadata as
`baseline_reward`, the baseline of ReMax's advantage (processors/advantages.py)."""

from __future__ import annotations

from undertow.schemas import Task

from undertow.rollout.engines.base import Sample
from undertow.rollout.rewards.registry import total
from undertow.rollout.workflows.base import Trajectory, WorkflowContext, prompt_tokens, workflow
from undertow.rollout.workflows.batch import Outcome, batched, one_by_one


@workflow("single_turn")
def single_turn(task: Task, ctx: WorkflowContext) -> list[Trajectory]:
    """`task.group_size` samples of one prompt, generated in one batch and each scored by the reward."""
    text, tokens = prompt_tokens(task, ctx)
    samples = ctx.engine.generate([tokens], task.group_size, ctx.sampling)[0]
    greedy = _greedy_answers([tokens], ctx)[0]
    return _scored(task, ctx, text, tokens, samples, greedy)


single_turn.greedy_baseline = True  # it can score a greedy answer beside the samples


@batched(single_turn)
def single_turn_batch(tasks: list[Task], ctx: WorkflowContext) -> list[Outcome]:
    """Every task's prompt in one engine call (one per distinct group size), then each task scored alone."""
    outcomes: dict[int, Outcome] = {}
    prompts: dict[int, tuple[str, list[int]]] = {}
    for i, task in enumerate(tasks):
        try:
            prompts[i] = prompt_tokens(task, ctx)
        except Exception as e:  # e.g. messages the chat template refuses: that task only
            outcomes[i] = e
    for n in sorted({tasks[i].group_size for i in prompts}):
        same = [i for i in prompts if tasks[i].group_size == n]
        try:
            groups = ctx.engine.generate([prompts[i][1] for i in same], n, ctx.sampling)
            greedy = _greedy_answers([prompts[i][1] for i in same], ctx)
        except Exception:  # one prompt the engine refuses (too long…) must not fail the others
            outcomes.update(zip(same, one_by_one(single_turn, [tasks[i] for i in same], ctx)))
            continue
        for i, samples, answer in zip(same, groups, greedy):
            try:
                outcomes[i] = _scored(tasks[i], ctx, *prompts[i], samples, answer)
            except Exception as e:  # a reward that fails on this task
                outcomes[i] = e
    return [outcomes[i] for i in range(len(tasks))]


def _greedy_answers(prompts: list[list[int]], ctx: WorkflowContext) -> list[str | None]:
    """With ctx.greedy_baseline, each prompt's greedy answer (one engine call, no log-probs: it is
    never trained); else None for each."""
    if not ctx.greedy_baseline:
        return [None] * len(prompts)
    greedy = ctx.sampling.model_copy(update={"greedy": True, "logprobs": False})
    return [answer[0].text for answer in ctx.engine.generate(prompts, 1, greedy)]


def _scored(task: Task, ctx: WorkflowContext, text: str, tokens: list[int], samples: list[Sample],
            greedy: str | None = None) -> list[Trajectory]:
    metadata = {} if greedy is None else {"baseline_reward": total(ctx.reward(greedy, task))}
    return [
        Trajectory(prompt_text=text, prompt_tokens=tokens, response_text=s.text, response_tokens=s.tokens,
                   logprobs=s.logprobs, loss_mask=[1] * len(s.tokens), finish_reason=s.finish_reason,
                   reward_components=ctx.reward(s.text, task), versions=s.versions, metadata=dict(metadata))
        for s in samples
    ]
