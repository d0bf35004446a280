"""A taskset's items before they become Tasks, and the registry of taskset sources.

A source is `fn(**kwargs) -> list[TaskItem]`; config names it like any component:
`{name: jsonl, path: data/train.jsonl, fields: {prompt: question}}`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from pydantic import JsonValue

from undertow.kernel.registry import Registry


@dataclass
class TaskItem:
    """One item of a taskset; `key` is stable across epochs (row index, id column, or draw seed)."""

    key: str
    prompt: str = ""
    messages: list[dict[str, str]] = field(default_factory=list)
    answer: str | None = None
    metadata: dict[str, JsonValue] = field(default_factory=dict)


sources: Registry[Callable[..., list[TaskItem]]] = Registry("taskset source")


def source(name: str) -> Callable:
    """Decorator: `@source("jsonl")`."""
    return sources.register(name)


def load_items(entry: str | Mapping[str, Any]) -> list[TaskItem]:
    """The items of a source config entry; an empty taskset is an error, not a silent no-op."""
    component = sources.resolve(entry)
    items = list(component())
    if not items:
        raise ValueError(f"taskset source {component.name!r} {component.kwargs}: no items")
    bad = [type(i).__name__ for i in items[:3] if not isinstance(i, TaskItem)]
    if bad:
        raise TypeError(f"taskset source {component.name!r} must return TaskItems, got {bad}")
    return items
