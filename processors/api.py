"""The plugin contract: what a processor is, what it may return, and how config names it.

A processor is either
- a plain function `fn(exp: Experience, **kwargs) -> Experience | list[Experience] | None | Reject`
  (None drops the record with reason "dropped"; a list fans out), or
- a class constructed with the config's keyword arguments, with `process(exp)` (same results),
  and/or `process_group(group: list[Experience]) -> list[Experience] | Reject` for whole prompt
  groups, and/or `process_batch(exps) -> list[Experience | list | None | Reject]` (one result per
  input, for scorers that batch).
A class may also define `bind(stores)` to receive named state stores (processors/state.py),
`flush()` to write the state a batch changed (called once after each batch), and `task_stats()`
to hand out TaskStat records for the task-stats topic.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from undertow.kernel.registry import Component, Registry
from undertow.schemas import Experience

PROCESSORS: Registry[Any] = Registry("processor")


@dataclass(frozen=True)
class Reject:
    """A processor's verdict that a record must not reach training; it goes to the rejected topic."""

    reason: str
    detail: str = ""


Result = Experience | list[Experience] | None | Reject


def processor(name: str) -> Callable[[Any], Any]:
    """Decorator registering a processor function or class under a short name."""
    return PROCESSORS.register(name)


class Stage:
    """One resolved pipeline entry, with a uniform interface over functions and classes."""

    def __init__(self, component: Component[Any]):
        self.name = component.name
        bound = component.bind()
        self.impl = bound if inspect.isclass(component.obj) else _FunctionProcessor(bound)
        has = [m for m in ("process", "process_group", "process_batch") if callable(getattr(self.impl, m, None))]
        if not has:
            raise TypeError(f"processor {self.name!r}: a class needs process, process_group or process_batch")

    @property
    def is_group_stage(self) -> bool:
        return callable(getattr(self.impl, "process_group", None))

    def bind(self, stores: Callable[[str], Any]) -> None:
        if callable(getattr(self.impl, "bind", None)):
            self.impl.bind(stores)

    def run_batch(self, exps: list[Experience]) -> list[Result]:
        """One result per input experience."""
        batch = getattr(self.impl, "process_batch", None)
        if callable(batch):
            results = list(batch(exps))
            if len(results) != len(exps):
                raise RuntimeError(f"process_batch returned {len(results)} results for {len(exps)} inputs")
            return results
        process = getattr(self.impl, "process", None)
        if not callable(process):  # a group-only stage passes single records through
            return list(exps)
        return [process(exp) for exp in exps]

    def run_group(self, group: list[Experience]) -> list[Experience] | Reject:
        result = self.impl.process_group(group)
        if isinstance(result, Reject):
            return result
        return list(result or [])

    def flush(self) -> None:
        flush = getattr(self.impl, "flush", None)
        if callable(flush):
            flush()

    def task_stats(self) -> list[Any]:
        stats = getattr(self.impl, "task_stats", None)
        return list(stats()) if callable(stats) else []


class _FunctionProcessor:
    def __init__(self, fn: Callable[[Experience], Result]):
        self.process = fn


def build_stages(entries: list[str | Mapping[str, Any]]) -> list[Stage]:
    """Resolve config entries (`name`, `pkg.mod.fn`, or `{name: …, **kwargs}`) into stages, in order."""
    # Importing the built-ins registers them; done here so `processors.api` stays import-light.
    import undertow.processors.builtins  # noqa: F401

    return [Stage(PROCESSORS.resolve(entry)) for entry in entries]
