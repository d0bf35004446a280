"""What a workflow receives and returns, and the workflow registry.

A workflow is `fn(task, ctx, **kwargs) -> list[Trajectory]` returning `task.group_size`
trajectories; it gets its own keyword arguments from the config entry, never the config tree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

from undertow.kernel.registry import Registry
from undertow.schemas import Task

from undertow.rollout.engines.base import Engine, SamplingParams
from undertow.rollout.rewards.registry import RewardFn


@dataclass
class WorkflowContext:
    """The engine, sampling settings and reward a workflow runs with."""

    engine: Engine
    sampling: SamplingParams
    reward: RewardFn
    chat_template: bool = True  # wrap a plain prompt as a user message when the tokenizer has a template
    greedy_baseline: bool = False  # also score one greedy answer per task (ReMax's baseline), where the workflow can


@dataclass
class Trajectory:
    """One sample of a group: the prompt, everything after it, and how it was scored.

    `response_tokens` holds the policy's tokens and (multi-turn) the environment's observation
    tokens in between; `loss_mask` is 1 for the former and 0 for the latter.
    """

    prompt_text: str
    prompt_tokens: list[int]
    response_text: str
    response_tokens: list[int]
    logprobs: list[float]
    loss_mask: list[int]
    finish_reason: Literal["stop", "length", "abort"]
    reward_components: dict[str, float]
    metadata: dict[str, Any] = field(default_factory=dict)
    versions: list[int] = field(default_factory=list)  # per response token (Sample.versions); empty: all the held one


Workflow = Callable[[Task, WorkflowContext], list[Trajectory]]
workflows: Registry[Callable[..., list[Trajectory]]] = Registry("workflow")


def workflow(name: str) -> Callable:
    """Decorator: `@workflow("single_turn")`."""
    return workflows.register(name)


def build_workflow(entry: str | Mapping[str, Any]) -> Workflow:
    """A config entry bound to its keyword arguments: `fn(task, ctx) -> list[Trajectory]`."""
    return workflows.resolve(entry).bind()


def prompt_tokens(task: Task, ctx: WorkflowContext) -> tuple[str, list[int]]:
    """The prompt as text and token ids: chat messages through the tokenizer's chat template, a plain
    prompt as one user message when `ctx.chat_template` and the tokenizer has a template, else raw."""
    tok = ctx.engine.tokenizer
    messages = task.messages or [{"role": "user", "content": task.prompt}]
    if getattr(tok, "chat_template", None) and (task.messages or ctx.chat_template):
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    else:
        text = task.prompt
    # The template already holds any special tokens the model expects.
    return text, tok(text, add_special_tokens=False)["input_ids"]
