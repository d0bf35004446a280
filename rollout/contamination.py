"""How held out a held-out taskset is: the share of its prompts that training can also draw.

A prompt counts as shared when a feeder taskset has an item with the same prompt text and messages,
which is what the workflow renders with the chat template (both sides through the same template).
Every taskset source returns its items as a list, so this is an enumeration, not a sample: exact.
"""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Sequence

from undertow.rollout.config import TasksetConfig
from undertow.rollout.feeder.items import TaskItem, load_items


def prompt_of(item: TaskItem) -> tuple[str, str]:
    """What identifies an item's prompt: its text and its messages."""
    return item.prompt, json.dumps(item.messages, sort_keys=True) if item.messages else ""


@lru_cache(maxsize=32)
def _items(source: str) -> tuple[TaskItem, ...]:
    # A config check asks once per stage and for the whole run: one load per source, not each time.
    return tuple(load_items(json.loads(source)))


@lru_cache(maxsize=32)
def _prompts(source: str) -> frozenset[tuple[str, str]]:
    return frozenset(prompt_of(i) for i in _items(source))


def _key(taskset: TasksetConfig) -> str:
    return json.dumps(taskset.source, sort_keys=True)


def prompts(taskset: TasksetConfig) -> frozenset[tuple[str, str]]:
    """Every prompt the taskset's source can give (loaded once per process for each source)."""
    return _prompts(_key(taskset))


def contamination(heldout: Sequence[TaskItem], training: Sequence[TasksetConfig]) -> float:
    """The share of the held-out items whose prompt a training taskset also has (0 for no items)."""
    if not heldout:
        return 0.0
    trained = frozenset().union(*(prompts(t) for t in training))
    return sum(prompt_of(i) in trained for i in heldout) / len(heldout)


def heldout_items(taskset: TasksetConfig, max_tasks: int | None) -> list[TaskItem]:
    """The items the evaluator scores: the first `max_tasks` of the source."""
    return list(_items(_key(taskset))[:max_tasks])


def shares(heldout: Sequence[TasksetConfig], max_tasks: int | None,
           training: Sequence[TasksetConfig]) -> list[tuple[TasksetConfig, float]]:
    """Each held-out taskset with its contamination by `training`, in order."""
    return [(t, contamination(heldout_items(t, max_tasks), training)) for t in heldout]


def held_out_text(share: float | None) -> str:
    """How a summary says it: held out, or the share of training prompts."""
    if share is None:
        return "contamination not measured"
    return "held out (no training prompt)" if share == 0 else f"{share:.0%} of its prompts are training prompts"
