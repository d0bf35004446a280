"""The small statistics built-in watchers share: a rolling window and an edge trigger."""

from __future__ import annotations

from collections import deque


class Rolling:
    """The last `size` values, and their mean once the window is full."""

    def __init__(self, size: int):
        self.values: deque[float] = deque(maxlen=size)

    def add(self, value: float) -> None:
        self.values.append(value)

    @property
    def full(self) -> bool:
        return len(self.values) == self.values.maxlen

    def mean(self) -> float:
        return sum(self.values) / len(self.values) if self.values else 0.0


class Trigger:
    """Fires once when a condition becomes true and re-arms once it is false again: a statistic that
    stays past its threshold is one alert, not one per record."""

    def __init__(self) -> None:
        self.active = False

    def __call__(self, condition: bool) -> bool:
        fired = condition and not self.active
        self.active = condition
        return fired
