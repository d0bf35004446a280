"""Follow the metrics topic: append every event to <run>/metrics.jsonl and keep the latest values;
and publish the run's own events (its restart policy, each restart and its cause) onto that topic."""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path

from undertow.schemas import MetricEvent
from undertow.streams import KafkaSettings, RecordConsumer, RecordProducer, Topics

log = logging.getLogger(__name__)


class MetricsRecorder(threading.Thread):
    """A daemon thread that records the run's metrics as they arrive (the run's own copy of them)."""

    def __init__(self, kafka: KafkaSettings, namespace: str, path: Path, labels: dict[str, str] | None = None,
                 after: float | None = None):
        super().__init__(name="metrics-recorder", daemon=True)
        self.kafka, self.topics, self.path, self.labels = kafka, Topics(namespace), path, labels or {}
        self.after = after  # a resumed stage: events up to then are in the file already
        self.latest: dict[str, MetricEvent] = {}  # component -> newest event (the full record is the file)
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with RecordConsumer(self.kafka, [self.topics.metrics], group_id=None, expect=MetricEvent,
                            rejected_topic=self.topics.rejected, stage="metrics") as consumer, \
                open(self.path, "a") as out:
            while not self._halt.is_set():
                deliveries = consumer.poll(timeout_ms=500)
                for d in deliveries:
                    event = d.record
                    if self.after is not None and event.time <= self.after:
                        continue
                    out.write(json.dumps({**event.labels, **self.labels, "component": event.component,
                                          "step": event.step, "time": event.time, **event.values}) + "\n")
                    with self._lock:
                        self.latest[event.component] = event
                out.flush()

    def value(self, component_prefix: str, name: str) -> float | None:
        """The newest value of `name` reported by any component starting with `component_prefix`."""
        with self._lock:
            events = [e for c, e in self.latest.items() if c.startswith(component_prefix) and name in e.values]
        return max(events, key=lambda e: e.time).values[name] if events else None

    def last_time(self, component: str) -> float | None:
        """When `component` last reported (its clock), or None if it has not yet."""
        with self._lock:
            event = self.latest.get(component)
        return event.time if event else None

    def stop(self) -> None:
        self._halt.set()
        self.join(10)


class RunEvents:
    """The supervisor's own metric events (component "run"), on the metrics topic like everyone's:
    the recorder writes them to metrics.jsonl, the archive and `undertow query` see them too."""

    def __init__(self, kafka: KafkaSettings, namespace: str):
        self.topic = Topics(namespace).metrics
        # A send never blocks the watch for long while a broker is down (a producer's default waits out the outage).
        self.producer = RecordProducer(kafka, max_block_ms=5000)

    def publish(self, event: str, values: dict[str, float], **labels: str) -> None:
        """Send one event; a broker that refuses it costs the event, not the run (it is in run.json too)."""
        record = MetricEvent(component="run", values=values, time=time.time(), labels={"event": event, **labels})
        try:
            self.producer.send(self.topic, record, key="run")
            self.producer.flush(timeout=10)  # bounded: the watch of the other components waits meanwhile
        except Exception as e:  # noqa: BLE001 — supervision must go on while a broker is down
            log.warning("run: could not publish the %s event: %s", event, e)

    def close(self) -> None:
        try:
            self.producer.close(timeout=10)
        except Exception:  # noqa: BLE001
            pass


def last_recorded(path: Path, **labels: str) -> float | None:
    """When the newest row with these labels was reported, or None: where a resumed stage's recording
    continues (the metrics topic is read from its beginning again)."""
    times = [r["time"] for r in read_metrics(path) if all(r.get(k) == v for k, v in labels.items())]
    return max(times, default=None)


def read_metrics(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl file."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
