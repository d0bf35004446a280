"""The no-broker harness: feed hand-made records to one watcher and read back its alerts."""

from __future__ import annotations

from typing import Iterable

from undertow.schemas import MetricEvent, Record
from undertow.watchers.api import Alert, alert_event, as_alerts, step_of
from undertow.watchers.config import Entry, watcher_specs


class Harness:
    """One watcher built from its config entry, as `undertow watch` builds it."""

    def __init__(self, entry: Entry):
        (self.spec,) = watcher_specs([entry])
        self.watcher = self.spec.build()
        self.alerts: list[Alert] = []
        self.events: list[MetricEvent] = []  # the alerts as they would land on the metrics topic

    def feed(self, records: Iterable[Record]) -> list[Alert]:
        """Deliver records in order; returns this call's alerts."""
        types, out = self.spec.record_types(), []
        for record in records:
            if not isinstance(record, types):  # a test feeding a topic the watcher does not read
                raise TypeError(f"watcher {self.spec.name!r} reads {self.spec.reads}, not {type(record).__name__}")
            alerts = as_alerts(self.watcher(record))
            self.events += [alert_event(self.spec.name, a, step_of(record)) for a in alerts]
            out += alerts
        self.alerts += out
        return out

    def names(self) -> list[str]:
        """The alerts so far, by name, in order."""
        return [a.alert for a in self.alerts]
