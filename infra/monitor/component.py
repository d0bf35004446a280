"""The monitor: the metrics topic written to every configured sink, resuming where it stopped.

Each MetricEvent becomes one Scalar per value, tagged `<component>/<name>` (with the labels that
name a source between: a processor worker, a run event and its child), at the policy version as
the step. Offsets are committed in the consumer group `<namespace>-monitor` only after every sink
flushed, so a crash rewrites at most the last poll's points and loses none.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from undertow.infra.monitor.config import MonitorConfig
from undertow.infra.monitor.lag import COMPONENT as LAG, LagPublisher
from undertow.infra.monitor.sinks import Scalar, Sink, SinkContext, safe_tag, sinks
from undertow.schemas import MetricEvent
from undertow.streams import Delivery, RecordConsumer, RecordProducer, RunContext

log = logging.getLogger(__name__)
SOURCE_LABELS = ("worker", "event", "child", "watcher")  # labels that tell two series of one component apart


class PlotStep:
    """The policy version to plot an event at: its own step (the trainer's step is its version, a
    worker's the version it generates with), else the newest version reported before it."""

    def __init__(self) -> None:
        self.latest = 0

    def step_of(self, event: MetricEvent) -> int:
        if event.step is None:
            return self.latest
        self.latest = max(self.latest, event.step)
        return event.step


def scalars_of(event: MetricEvent, step: int) -> list[Scalar]:
    source = [event.labels[k] for k in SOURCE_LABELS if k in event.labels]
    prefix = "/".join([event.component, *source])
    return [Scalar(safe_tag(f"{prefix}/{name}"), value, step, event.time) for name, value in event.values.items()]


@dataclass
class MonitorStats:
    events: int = 0
    scalars: int = 0
    replayed: int = 0  # events before the committed offsets, read again only to know the version


class Monitor:
    def __init__(self, cfg: MonitorConfig, context: RunContext):
        namespace = context.namespace
        self.cfg, self.kafka, self.topics = cfg, context.kafka, context.topics
        self.context = SinkContext(Path(cfg.dir), cfg.run or namespace, cfg.stage, namespace)
        self.sinks: list[Sink] = [sinks.resolve(entry)(self.context) for entry in cfg.sinks]
        self.clock = PlotStep()
        self.stats = MonitorStats()
        self.lag = LagPublisher(context.kafka, namespace, cfg.lag_every_s)

    def run(self, stop: Callable[[], bool], idle_timeout_s: float | None = None) -> MonitorStats:
        """Write until `stop()` (then drain what is on the topic for up to `drain_s`) or idle too long."""
        with RecordConsumer(self.kafka, [], group_id=f"{self.topics.namespace}-monitor", expect=MetricEvent,
                            rejected_topic=self.topics.rejected, stage="monitor") as consumer, \
                RecordProducer(self.kafka) as producer:
            self._catch_up_clock(consumer)
            last_data, drain_until, ends = time.monotonic(), None, None
            try:
                while True:
                    if drain_until is None and stop():
                        drain_until, ends = time.monotonic() + self.cfg.drain_s, consumer.end_offsets()
                    if ends is not None and (consumer.reached(ends) or time.monotonic() > drain_until):
                        break
                    if drain_until is None and (lag := self.lag.event()) is not None:
                        producer.send(self.topics.metrics, lag, key=LAG)  # read back below, like any metric
                    deliveries = consumer.poll(timeout_ms=500)
                    if deliveries:
                        self._write(deliveries)
                        consumer.commit()  # after the sinks flushed: a crash rewrites, never skips
                        if any(d.record.component != LAG for d in deliveries):  # its own lag is not activity
                            last_data = time.monotonic()
                    if idle_timeout_s is not None and time.monotonic() - last_data > idle_timeout_s:
                        break
            finally:
                for sink in self.sinks:
                    sink.close()
        return self.stats

    def _catch_up_clock(self, consumer: RecordConsumer) -> None:
        """Resume after the committed offsets, with the version the events before them left off at."""
        committed = consumer.assign(self.topics.metrics, "committed")
        first = consumer.assign(self.topics.metrics, "earliest")
        if committed == first:
            return
        while not consumer.reached(committed):
            for d in consumer.poll(timeout_ms=500):
                if d.offset < committed[(d.topic, d.partition)]:
                    self.clock.step_of(d.record)
                    self.stats.replayed += 1
        consumer.assign(self.topics.metrics, committed)  # what was read past them is read again

    def _write(self, deliveries: list[Delivery[MetricEvent]]) -> None:
        for d in deliveries:
            self.lag.saw(d.record)
        scalars = [s for d in deliveries for s in scalars_of(d.record, self.clock.step_of(d.record))]
        for sink in self.sinks:
            sink.write(scalars)
            sink.flush()
        self.stats.events += len(deliveries)
        self.stats.scalars += len(scalars)
