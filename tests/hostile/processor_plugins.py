"""Processor plugins that misbehave on purpose, named by dotted path in the hostile tests' configs."""

from __future__ import annotations

from undertow.schemas import Experience


class GroupBoom:
    """A group processor with a bug: it raises on any group holding the response "group-boom"."""

    def process_group(self, group: list[Experience]) -> list[Experience]:
        if any(e.response_text == "group-boom" for e in group):
            raise KeyError("a group plugin bug")
        return group


class RaisesWhenBuilt:
    """A processor whose constructor refuses its argument (a config error, not a stream error)."""

    def __init__(self, *, level: int = 0):
        if level < 0:
            raise ValueError(f"level must be >= 0, got {level}")

    def process(self, exp: Experience) -> Experience:
        return exp


def hang_on(exp: Experience, *, text: str = "hang") -> Experience:
    """A processor with a bug that never returns on one response (blocks the event loop, as sync code does)."""
    if exp.response_text == text:
        import time
        time.sleep(3600)
    return exp
