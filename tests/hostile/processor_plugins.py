"""Processor plugins that misbehave on purpose, named by dotted path in the hostile tests' configs."""

from __future__ import annotations

import threading

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


RELEASE = threading.Event()  # set by a test's teardown: the calls that hung return and their threads end


def hang_until_released(exp: Experience, *, text: str = "hang") -> Experience:
    """Hangs on one response until the test releases it (a plugin bug, a remote call without a timeout)."""
    if exp.response_text == text:
        RELEASE.wait()
    return exp


class GroupHang:
    """A group processor that hangs on any group holding the response "group-hang"."""

    def process_group(self, group: list[Experience]) -> list[Experience]:
        if any(e.response_text == "group-hang" for e in group):
            RELEASE.wait()
        return group


def register_hanging_datajuicer_op() -> str:
    """A data-juicer filter (registered into data-juicer's own op registry) that hangs on the text "hang"."""
    from data_juicer.ops import OPERATORS
    from data_juicer.ops.base_op import Filter

    name = "undertow_test_hang_filter"
    if name not in OPERATORS.modules:

        @OPERATORS.register_module(name)
        class HangFilter(Filter):
            _batched_op = True

            def compute_stats_batched(self, samples):
                if "hang" in samples[self.text_key]:
                    RELEASE.wait()
                return samples

            def process_batched(self, samples):
                return [True] * len(samples[self.text_key])
    return name
