"""The reward registry and how a config entry becomes a callable.

A reward is user code run on every sample: one that hangs (a catastrophic regex, a sandbox that
never returns, a remote scorer without a timeout) would stall the worker for good. `build_reward`
therefore calls it on a thread of its own and waits at most `timeout_s`; no result by then raises
NoVerdict("timeout"), and the worker dead-letters the task with reason `timeout` and goes on (the
pattern of the scorers' deadline, kernel/scoring/base.py; a reward with a deadline of its own says
so with `own_deadline = True` and is called directly). Python cannot stop a thread: the hung
call keeps its (daemon) thread, and once `MAX_HUNG` of them hang every further call is refused at
once, so hung threads never pile up without bound.
"""

from __future__ import annotations

import functools
import math
import threading
from typing import Any, Callable, Mapping

from undertow.kernel.registry import Registry
from undertow.schemas import Task

RewardFn = Callable[[str, Task], dict[str, float]]

rewards: Registry[Callable[..., dict[str, float]]] = Registry("reward")


def reward(name: str) -> Callable:
    """Decorator: `@reward("boxed_answer")` registers `fn(response, task, **kwargs) -> dict[str, float]`."""
    return rewards.register(name)


TIMEOUT = "timeout"  # the rejected record's reason
MAX_HUNG = 4  # reward calls still running past their timeout, per reward, before calls are refused outright


class NoVerdict(RuntimeError):
    """A reward gave no verdict; `reason` is the rejected record's reason."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def build_reward(entry: str | Mapping[str, Any], *, timeout_s: float | None = None) -> RewardFn:
    """A config entry (`name`, dotted path, or `{name: …, **kwargs}`) bound to its keyword arguments;
    with `timeout_s`, a call that takes longer raises NoVerdict("timeout")."""
    component = rewards.resolve(entry)
    checked = functools.partial(_checked, component.name, component.bind())
    if timeout_s is None or getattr(component.obj, "own_deadline", False):  # e.g. the model rewards' scorers
        return checked
    return _Deadline(component.name, checked, timeout_s)


class _Deadline:
    """A reward called on a daemon thread, waited for at most `timeout_s`."""

    def __init__(self, name: str, fn: RewardFn, timeout_s: float):
        self.name, self.fn, self.timeout_s = name, fn, timeout_s
        self.hung: list[threading.Thread] = []

    def __call__(self, response: str, task: Task) -> dict[str, float]:
        self.hung = [t for t in self.hung if t.is_alive()]
        if len(self.hung) >= MAX_HUNG:
            raise NoVerdict(TIMEOUT, f"reward {self.name!r}: {len(self.hung)} earlier calls still hang past "
                                     f"{self.timeout_s:g} s; not called")
        outcome: dict[str, Any] = {}

        def call() -> None:
            try:
                outcome["value"] = self.fn(response, task)
            except BaseException as e:  # handed to the caller's thread
                outcome["error"] = e

        thread = threading.Thread(target=call, name=f"reward-{self.name}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            self.hung.append(thread)
            raise NoVerdict(TIMEOUT, f"reward {self.name!r}: no result within {self.timeout_s:g} s")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]


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
