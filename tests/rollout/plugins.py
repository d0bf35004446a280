"""User plugins for the tests, loaded by dotted path like a user's own module would be."""

from __future__ import annotations

import time

from undertow.schemas import Task

from undertow.rollout.workflows import StepResult, Trajectory, WorkflowContext


def length_bonus(response: str, task: Task, *, per_char: float = 1.0) -> dict[str, float]:
    return {"length": per_char * len(response)}


def not_a_dict(response: str, task: Task) -> float:
    return 1.0


class Echo:
    """An environment that is done after `turns` steps, rewarding 1 at the end."""

    def __init__(self, *, turns: int = 2):
        self.turns, self.seen = turns, 0

    def reset(self, task: Task) -> str:
        return "say something"

    def step(self, action: str) -> StepResult:
        self.seen += 1
        return StepResult("again", float(self.seen == self.turns), self.seen >= self.turns)


def constant_workflow(task: Task, ctx: WorkflowContext, *, text: str = "7") -> list[Trajectory]:
    tokens = ctx.engine.tokenizer(text)["input_ids"]
    return [Trajectory(prompt_text=task.prompt, prompt_tokens=[5], response_text=text, response_tokens=tokens,
                       logprobs=[-1.0] * len(tokens), loss_mask=[1] * len(tokens), finish_reason="stop",
                       reward_components=ctx.reward(text, task)) for _ in range(task.group_size)]


def sevens(response: str, task: Task) -> dict[str, float]:
    """1 for an answer that starts with 7: what the eval tests train the tiny model toward."""
    return {"sevens": float(response.strip().startswith("7"))}


SCORED: list[tuple[str, str]] = []  # (task id, answer text) of every answer `by_metadata` scored


def by_metadata(response: str, task: Task) -> dict[str, float]:
    """1 when the task's metadata says it always passes: difficulty scoring with known pass rates."""
    SCORED.append((task.task_id, response))
    return {"pass": float(task.metadata["passes"])}


def remote_verifier(response: str, task: Task, *, seconds: float = 0.05) -> dict[str, float]:
    """A reward that waits on a service (a sandbox, a remote judge) for `seconds` per sample: each
    worker's throughput is then bound by its own waits, not by the cores its neighbours share."""
    time.sleep(seconds)
    return {"correct": float(response.strip() == task.answer)}
