"""The reward registry and how a config entry becomes a callable."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable, Mapping

from undertow.kernel.registry import Registry
from undertow.schemas import Task

RewardFn = Callable[[str, Task], dict[str, float]]

rewards: Registry[Callable[..., dict[str, float]]] = Registry("reward")


def reward(name: str) -> Callable:
    """Decorator: `@reward("boxed_answer")` registers `fn(response, task, **kwargs) -> dict[str, float]`."""
    return rewards.register(name)


def build_reward(entry: str | Mapping[str, Any]) -> RewardFn:
    """A config entry (`name`, dotted path, or `{name: …, **kwargs}`) bound to its keyword arguments."""
    component = rewards.resolve(entry)
    return functools.partial(_checked, component.name, component.bind())


def total(components: Mapping[str, float]) -> float:
    """The scalar reward: the sum of the components (weights are applied inside `weighted`)."""
    return float(sum(components.values()))


def _checked(name: str, fn: Callable[..., Any], response: str, task: Task) -> dict[str, float]:
    """Call a reward and insist on its contract: a mapping of names to finite floats."""
    out = fn(response, task)
    if not isinstance(out, Mapping):
        raise TypeError(f"reward {name!r} returned {type(out).__name__}, expected dict[str, float]")
    values = {str(k): float(v) for k, v in out.items()}
    bad = [k for k, v in values.items() if not math.isfinite(v)]
    if bad:
        raise ValueError(f"reward {name!r}: components {bad} are not finite")
    return values
