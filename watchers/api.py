"""The watcher contract: what a watcher reads, what it returns, and how config names it.

A watcher is either
- a plain function `fn(record, **kwargs) -> Alert | list[Alert] | None`, registered with
  `@watcher("name", reads=("raw",))`; it keeps no state between records, or
- a class built once with the config's keyword arguments, with a `reads` class attribute and
  `__call__(record) -> Alert | list[Alert] | None`; it keeps its windows on itself.
`reads` names topics of the catalog: raw and ready (Experience), rejected (Rejected), metrics
(MetricEvent), evals (EvalResult). A watcher sees every record of those topics, nothing else, and
tells two topics apart by the record's type (so it reads at most one of raw and ready).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from undertow.kernel.registry import Registry
from undertow.schemas import EvalResult, Experience, MetricEvent, Record, Rejected

WATCHERS: Registry[Any] = Registry("watcher")
COMPONENT = "watcher"  # the metric events' component, alerts and errors alike

# The topics a watcher may read (Topics' attribute names) and the record each carries.
READABLE: dict[str, type[Record]] = {"raw": Experience, "ready": Experience, "rejected": Rejected,
                                      "metrics": MetricEvent, "evals": EvalResult}


@dataclass(frozen=True)
class Alert:
    """A statistic past its threshold: `statistic` is what was measured, `value` its value now."""

    alert: str
    statistic: str
    value: float
    threshold: float
    details: dict[str, float] = field(default_factory=dict)  # other numbers worth seeing beside it
    labels: dict[str, str] = field(default_factory=dict)  # e.g. the taskset it is about


Verdict = Alert | list[Alert] | None


def watcher(name: str, *, reads: tuple[str, ...]) -> Callable[[Any], Any]:
    """Decorator registering a watcher function or class under a short name, with the topics it reads."""
    def add(obj: Any) -> Any:
        obj.reads = tuple(reads)
        reads_of(obj, name)  # refuse an unknown topic when the module is imported
        return WATCHERS.register(name)(obj)
    return add


def reads_of(obj: Any, name: str) -> tuple[str, ...]:
    """The topics `obj` reads, checked: a watcher named by dotted path must say so itself."""
    reads = getattr(obj, "reads", None)
    if not reads or isinstance(reads, str) or not all(r in READABLE for r in reads):
        raise ValueError(f"watcher {name!r}: `reads` must list some of {sorted(READABLE)}, got {reads!r}")
    return tuple(reads)


def as_alerts(verdict: Verdict) -> list[Alert]:
    if verdict is None:
        return []
    return [verdict] if isinstance(verdict, Alert) else list(verdict)


def step_of(record: Record) -> int | None:
    """The policy version a record is about, to plot an alert at it."""
    if isinstance(record, Experience):
        return record.policy_version
    if isinstance(record, EvalResult):
        return record.version
    return getattr(record, "step", None)


def alert_event(watcher_name: str, alert: Alert, step: int | None) -> MetricEvent:
    """An alert as the metrics topic carries it: labels name the watcher and the alert."""
    return MetricEvent(component=COMPONENT, step=step,
                       values={**alert.details, alert.statistic: alert.value, "threshold": alert.threshold},
                       labels={**alert.labels, "watcher": watcher_name, "alert": alert.alert})


def error_event(watcher_name: str, error: BaseException, restarts: int) -> MetricEvent:
    """A watcher that raised: recorded, then restarted from its committed offsets."""
    return MetricEvent(component=COMPONENT, values={"restarts": float(restarts)},
                       labels={"watcher": watcher_name, "error": f"{type(error).__name__}: {error}"[:500]})
