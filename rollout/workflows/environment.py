"""The environment protocol of multi-turn workflows, and its registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol

from undertow.kernel.registry import Registry
from undertow.schemas import Task


@dataclass
class StepResult:
    """What an environment answers to one action."""

    observation: str  # shown to the policy next (kept in the experience with loss mask 0)
    reward: float
    done: bool


class Environment(Protocol):
    """One episode per instance: `reset` once, then `step` until done."""

    def reset(self, task: Task) -> str:
        """The first user message of the episode."""

    def step(self, action: str) -> StepResult:
        """React to the policy's latest response."""


environments: Registry[Callable[..., Environment]] = Registry("environment")


def environment(name: str) -> Callable:
    """Decorator: `@environment("number_guess")` on a class (or factory) taking keyword arguments."""
    return environments.register(name)


def environment_factory(entry: str | Mapping[str, Any]) -> Callable[[], Environment]:
    """A config entry as a zero-argument factory: a fresh environment per episode."""
    return environments.resolve(entry)  # calling the component builds one
