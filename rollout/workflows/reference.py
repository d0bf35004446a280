"""Demonstrations: the task's reference answer as the response, scored like any sample.

For an SFT warm-up stage (or distillation data): the experience carries the policy's log-probs
of the answer, so the same record can later feed off-policy RL or be replayed.
"""

from __future__ import annotations

from undertow.schemas import Task
from undertow.rollout.workflows.base import Trajectory, WorkflowContext, prompt_tokens, workflow


@workflow("reference")
def reference(task: Task, ctx: WorkflowContext) -> list[Trajectory]:
    """`task.group_size` copies of prompt → reference answer (+ end of sequence)."""
    if task.answer is None:
        raise ValueError(f"task {task.task_id}: the reference workflow needs task.answer")
    tok = ctx.engine.tokenizer
    text, tokens = prompt_tokens(task, ctx)
    answer = tok(task.answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    logprobs = ctx.engine.logprobs(tokens, answer, ctx.sampling.temperature)
    trajectory = Trajectory(prompt_text=text, prompt_tokens=tokens, response_text=task.answer, response_tokens=answer,
                            logprobs=logprobs, loss_mask=[1] * len(answer), finish_reason="stop",
                            reward_components=ctx.reward(task.answer, task), metadata={"reference": True})
    return [trajectory] * task.group_size
