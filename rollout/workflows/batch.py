"""Many tasks at once: a workflow's batched form, so one engine call generates a whole batch of tasks.

An engine batches far better than one group at a time (vLLM schedules every sequence it is given
together), so the worker hands its ready tasks over together. A workflow gains a batched form with
`@batched(one)` over `fn(tasks, ctx, **kwargs) -> list[Outcome]`: one outcome per task, in order,
either the task's trajectories or the exception that task raised, so one bad task does not fail the
others. Multi-turn workflows (multi_turn, tool_agent) batch each turn over every live episode
(episodes.py). A workflow without a batched form (reference: nothing is generated) runs task by
task, with the same outcomes.
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Mapping

from undertow.schemas import Task

from undertow.rollout.workflows.base import Trajectory, WorkflowContext, workflows

Outcome = list[Trajectory] | Exception  # a task's group, or why it failed
BatchWorkflow = Callable[[list[Task], WorkflowContext], list[Outcome]]


def batched(one: Callable[..., list[Trajectory]]) -> Callable[[Callable[..., list[Outcome]]], Callable[..., list[Outcome]]]:
    """Decorator: the function below is `one` for many tasks at once (it takes `one`'s keyword arguments)."""
    def attach(many: Callable[..., list[Outcome]]) -> Callable[..., list[Outcome]]:
        one.batched = many  # type: ignore[attr-defined]
        return many
    return attach


def build_batch_workflow(entry: str | Mapping[str, Any]) -> BatchWorkflow:
    """A config entry as `fn(tasks, ctx) -> list[Outcome]`: its batched form, else task by task."""
    component = workflows.resolve(entry)
    many = getattr(component.obj, "batched", None)
    if many is not None:
        return partial(many, **component.kwargs)
    return partial(one_by_one, component.bind())


def one_by_one(one: Callable[[Task, WorkflowContext], list[Trajectory]], tasks: list[Task],
               ctx: WorkflowContext) -> list[Outcome]:
    """Each task through the per-task workflow; a task that raises gets its exception as outcome."""
    outcomes: list[Outcome] = []
    for task in tasks:
        try:
            outcomes.append(one(task, ctx))
        except Exception as e:  # the worker dead-letters it; the other tasks go on
            outcomes.append(e)
    return outcomes
