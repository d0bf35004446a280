"""The autoscaling signal as metrics: the monitor publishes, every `lag_every_s`, one event of
component `lag` on the metrics topic, with the same numbers `undertow status --json` prints
(infra/report/scaling.py), so TensorBoard, W&B, MLflow, the report and a metrics exporter that an
autoscaler reads all see them.

Value names (the namespace is cut out of group and topic names, so the names stay the same from run
to run): `group.<group>` the group's total lag (e.g. `group.rollout`, `group.processors`,
`group.undertow-trainer`), `topic.<topic>` the largest lag of any group on that topic (`topic.tasks`,
`topic.experiences.raw`), and `trainer_wait_fraction` once the trainer has reported two steps.
"""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from undertow.infra.report.scaling import WAIT_WINDOW, lag_report, trainer_wait_fraction
from undertow.infra.report.namespace import namespace_status
from undertow.schemas import MetricEvent
from undertow.streams import KafkaSettings

COMPONENT = "lag"


def short_name(name: str, namespace: str) -> str:
    """`ns.rollout` -> `rollout`, `ns-processors` -> `processors`, `proc-ns` -> `proc`, `ns.tasks` -> `tasks`;
    a name without the namespace stays as it is."""
    for sep in ".-_":
        if name.startswith(namespace + sep):
            return name[len(namespace) + 1:]
        if name.endswith(sep + namespace):
            return name[:-len(namespace) - 1]
    return name


def lag_values(report: dict[str, Any], namespace: str) -> dict[str, float]:
    """A `lag_report` flattened into metric values (names above)."""
    values = {f"group.{short_name(g, namespace)}": float(v["lag"]) for g, v in report["groups"].items()}
    values |= {f"topic.{short_name(t, namespace)}": float(lag) for t, lag in report["topic_lag"].items()}
    return values


class LagPublisher:
    """Keeps the trainer's recent steps seen on the metrics topic and turns a namespace's lag into a
    MetricEvent when one is due."""

    def __init__(self, kafka: KafkaSettings, namespace: str, every_s: float | None):
        self.kafka, self.namespace, self.every_s = kafka, namespace, every_s
        self.steps: deque[dict[str, Any]] = deque(maxlen=WAIT_WINDOW + 1)
        self.due = time.monotonic() + (every_s or 0.0)  # the first after one period: a starting run has no lag yet

    def saw(self, event: MetricEvent) -> None:
        """Remember a trainer step (its time and the wait before it) for the wait fraction."""
        if event.component == "trainer" and "wait_s" in event.values:
            self.steps.append({"component": "trainer", "time": event.time, "wait_s": event.values["wait_s"]})

    def event(self) -> MetricEvent | None:
        """The lag event, if one is due now (None: not yet, or publishing is off)."""
        if self.every_s is None or time.monotonic() < self.due:
            return None
        self.due = time.monotonic() + self.every_s
        values = lag_values(lag_report(namespace_status(self.kafka, self.namespace)), self.namespace)
        wait = trainer_wait_fraction(list(self.steps))
        if wait is not None:
            values["trainer_wait_fraction"] = wait
        return MetricEvent(component=COMPONENT, values=values, time=time.time())
