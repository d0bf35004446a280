"""The order the suite's tests run in, and, under pytest-xdist (`-n 3`), which worker takes which when.

One session-wide demo run (tests/conftest.py, `demo`) feeds the longest tests: the README's commands,
the SIGKILLs, the soak, the presets. Taken in a fixed order, they either waited on the demo's run
holding a worker or came after every other long test and ran on into a tail with one core idle
(ci17: the last four and a half minutes at 55%). So the controller deals the tests itself: a free
worker gets the first test in `turn` order that can start now, the demo's readers once the demo's run
is made, and the worker making it gets a quick test behind it, not a long one that would wait with it
(tests/scheduling.py).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

DEMO_FIXTURES = {"demo", "demo_warm_start"}  # the session's one demo run
TURNS = "turns.json"  # each test's turn and whether it reads the demo, as the workers collected them
DEMO_MADE = "demo.json"  # written by the `demo` fixture once the demo's run has finished


def shared_dir(config: pytest.Config) -> Path:
    """The session's directory, which the controller and every worker see (each worker's own is below it)."""
    base = config._tmp_path_factory.getbasetemp()  # what the tmp_path fixtures use; xdist's workers live under it
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def needs_demo(item: pytest.Item) -> bool:
    return bool(DEMO_FIXTURES & set(getattr(item, "fixturenames", ())))


def turn(item: pytest.Item, maker: pytest.Item | None) -> int:
    """0: the test that makes the demo's run; 1: the slow tests that read it; 2: the other slow ones; 3:
    the quick ones, last, so the workers end together."""
    if item is maker:
        return 0
    if item.get_closest_marker("slow") is None:
        return 3
    return 1 if needs_demo(item) else 2


def order(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Sort `items` by turn (stable: file order within one) and, on a worker, tell the controller."""
    maker = next((i for i in items if needs_demo(i)), None)
    turns = {item.nodeid: turn(item, maker) for item in items}
    items.sort(key=lambda item: turns[item.nodeid])
    if os.environ.get("PYTEST_XDIST_WORKER"):
        table = {item.nodeid: [turns[item.nodeid], needs_demo(item)] for item in items}
        path = shared_dir(config) / TURNS
        tmp = path.with_suffix(f".{os.getpid()}")
        tmp.write_text(json.dumps(table))
        tmp.replace(path)  # every worker writes the same table: the last one whole stays
