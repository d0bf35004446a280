"""Built-in watchers of the experience topics: response length, format violations, rejections."""

from __future__ import annotations

from collections import deque

from undertow.schemas import Experience, Rejected
from undertow.watchers.api import Alert, watcher
from undertow.watchers.stats import Rolling, Trigger


@watcher("response_length", reads=("raw",))
class ResponseLength:
    """Responses blowing up: the mean length of the last `window` responses above `factor` times the
    mean of the first `baseline` ones (lengths grow when a policy learns to ramble or repeat)."""

    def __init__(self, *, window: int = 64, baseline: int = 64, factor: float = 2.0):
        if window < 1 or baseline < 1 or factor <= 1:
            raise ValueError(f"window and baseline must be >= 1 and factor > 1, got {window}, {baseline}, {factor}")
        self.window, self.first, self.factor = Rolling(window), Rolling(baseline), factor
        self.trigger = Trigger()

    def __call__(self, exp: Experience) -> Alert | None:
        length = float(len(exp.response_tokens))
        if not self.first.full:
            self.first.add(length)
        self.window.add(length)
        if not (self.first.full and self.window.full):
            return None
        threshold = self.factor * self.first.mean()
        mean = self.window.mean()
        if self.trigger(mean > threshold):
            return Alert("response_length_blowup", "response_tokens_mean", mean, threshold,
                         details={"baseline_tokens_mean": self.first.mean()})
        return None


@watcher("format_violations", reads=("raw",))
class FormatViolations:
    """Too many malformed responses in the last `window`: cut off at the length limit
    (finish_reason "length"), or, with `component`, scoring 0 on that reward component."""

    def __init__(self, *, window: int = 64, max_fraction: float = 0.5, component: str | None = None):
        if window < 1 or not 0 <= max_fraction < 1:
            raise ValueError(f"window must be >= 1 and 0 <= max_fraction < 1, got {window}, {max_fraction}")
        self.window, self.max_fraction, self.component = Rolling(window), max_fraction, component
        self.trigger = Trigger()

    def violates(self, exp: Experience) -> bool:
        if exp.finish_reason == "length":
            return True
        # An unscored component is not a violation: only a 0 the reward gave is.
        return self.component is not None and exp.reward_components.get(self.component) == 0.0

    def __call__(self, exp: Experience) -> Alert | None:
        self.window.add(float(self.violates(exp)))
        if not self.window.full:
            return None
        fraction = self.window.mean()
        if self.trigger(fraction > self.max_fraction):
            labels = {"component": self.component} if self.component else {}
            return Alert("format_violations", "violation_fraction", fraction, self.max_fraction, labels=labels)
        return None


class RejectedShare:
    """Among the last `window` records of an experience topic and the rejected topic: rejected
    records (of `reasons`, all when None) per experience above `max_rate`."""

    alert = "rejection_spike"
    reads: tuple[str, ...] = ("raw", "rejected")

    def __init__(self, *, window: int = 256, max_rate: float = 0.2, reasons: list[str] | None = None):
        if window < 1 or max_rate <= 0:
            raise ValueError(f"window must be >= 1 and max_rate > 0, got {window}, {max_rate}")
        self.recent: deque[bool] = deque(maxlen=window)  # True: a rejection counted, False: an experience
        self.max_rate, self.reasons = max_rate, set(reasons) if reasons is not None else None
        self.trigger = Trigger()

    def __call__(self, record: Experience | Rejected) -> Alert | None:
        if isinstance(record, Rejected):
            if self.reasons is not None and record.reason not in self.reasons:
                return None
            self.recent.append(True)
        else:
            self.recent.append(False)
        if len(self.recent) < self.recent.maxlen:
            return None
        rejected = sum(self.recent)
        rate = rejected / max(len(self.recent) - rejected, 1)
        if self.trigger(rate > self.max_rate):
            return Alert(self.alert, "rejected_per_experience", rate, self.max_rate,
                         details={"rejected": float(rejected)})
        return None


@watcher("rejection_rate", reads=("raw", "rejected"))
class RejectionRate(RejectedShare):
    """Rejections (any stage, any reason unless `reasons`) per raw experience spiking."""


@watcher("stale_fraction", reads=("ready", "rejected"))
class StaleFraction(RejectedShare):
    """The trainer refusing ready experiences as too stale: rollout has fallen behind the weights."""

    alert = "stale_spike"

    def __init__(self, *, window: int = 256, max_rate: float = 0.3, reasons: list[str] | None = None):
        super().__init__(window=window, max_rate=max_rate, reasons=["stale"] if reasons is None else reasons)
