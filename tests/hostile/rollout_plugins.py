"""A rollout workflow that misbehaves on request, named by dotted path in the hostile tests' configs."""

from __future__ import annotations

from undertow.schemas import Task

from undertow.rollout.workflows import Trajectory, WorkflowContext

HUGE_CHARS = 4_000_000  # the most a text field may hold (schemas MAX_TEXT_CHARS is 4 << 20)


def scripted(task: Task, ctx: WorkflowContext) -> list[Trajectory]:
    """Answers "7" to every sample, without generating; `task.metadata["hostile"]` changes that:
    "raise" fails the task, "huge" makes sample 0 an Experience of about 24 MB (over the 20 MiB
    Kafka message limit, while every field stays within its schema bound)."""
    hostile = task.metadata.get("hostile")
    if hostile == "raise":
        raise RuntimeError("workflow bug on purpose")
    out = []
    for i in range(task.group_size):
        huge = hostile == "huge" and i == 0
        prompt = "😀" * (HUGE_CHARS // 2) if huge else task.prompt  # 4 bytes per character in UTF-8
        text = "😀" * HUGE_CHARS if huge else "7"
        out.append(Trajectory(prompt_text=prompt, prompt_tokens=[5], response_text=text, response_tokens=[7, 8],
                              logprobs=[-1.0, -1.0], loss_mask=[1, 1], finish_reason="stop",
                              reward_components={"scripted": 1.0}))
    return out
