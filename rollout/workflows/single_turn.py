"""Single turn: prompt → response → reward, for each sample of the group."""

from __future__ import annotations

from schemas import Task

from rollout.workflows.base import Trajectory, WorkflowContext, prompt_tokens, workflow


@workflow("single_turn")
def single_turn(task: Task, ctx: WorkflowContext) -> list[Trajectory]:
    """`task.group_size` samples of one prompt, generated in one batch and each scored by the reward."""
    text, tokens = prompt_tokens(task, ctx)
    samples = ctx.engine.generate([tokens], task.group_size, ctx.sampling)[0]
    return [
        Trajectory(prompt_text=text, prompt_tokens=tokens, response_text=s.text, response_tokens=s.tokens,
                   logprobs=s.logprobs, loss_mask=[1] * len(s.tokens), finish_reason=s.finish_reason,
                   reward_components=ctx.reward(s.text, task))
        for s in samples
    ]
