"""Rewards for test_reward_timeout.py, named by dotted path as a user's would be."""

from __future__ import annotations

import threading

from undertow.schemas import Task

RELEASE = threading.Event()  # set by the test when it is done: the hung threads end


def hang_on_seven(response: str, task: Task) -> dict[str, float]:
    """Hangs on the task whose answer is 7 (a call that never returns, e.g. a catastrophic regex)."""
    if task.answer == "7":
        RELEASE.wait()
    return {"correct": float(response.strip() == task.answer)}


def hang(response: str, task: Task) -> dict[str, float]:
    """Hangs on every call until released; then calls every answer right."""
    RELEASE.wait()
    return {"correct": 1.0}
