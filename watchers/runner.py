"""`undertow watch`: every configured watcher on its own thread, consumer group and producer.

Each watcher reads its topics in the group `<namespace>.watcher.<name>`, so it resumes from its own
committed offsets and takes no record from anyone. Offsets are committed after the alerts a poll
raised are flushed. A watcher that raises has its error published (component `watcher`, label
`error`) and is rebuilt from its committed offsets after a backoff; the others never notice.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from undertow.schemas import DecodeError, decode
from undertow.streams import KafkaSettings, RecordConsumer, RecordProducer, RunContext, Topics
from undertow.watchers.api import COMPONENT, alert_event, as_alerts, error_event, step_of
from undertow.watchers.config import Entry, WatcherSpec, watcher_specs

log = logging.getLogger(__name__)


@dataclass
class WatcherStats:
    records: int = 0
    undecodable: int = 0  # skipped: dead-lettering them is the consuming stage's job, not a side reader's
    alerts: int = 0
    errors: int = 0


class WatcherLoop:
    """One watcher, restarted from its committed offsets whenever it raises, until `stop` is set."""

    def __init__(self, spec: WatcherSpec, kafka: KafkaSettings, namespace: str, stop: threading.Event, *,
                 backoff_s: float = 1.0, backoff_max_s: float = 30.0):
        self.spec, self.kafka, self.topics, self.stop = spec, kafka, Topics(namespace), stop
        self.backoff_s, self.backoff_max_s = backoff_s, backoff_max_s
        self.stats = WatcherStats()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                with RecordProducer(self.kafka) as producer:
                    self._consume(producer)
                return
            except Exception as e:  # noqa: BLE001 — a watcher's bug must never stop the run
                self.stats.errors += 1
                log.exception("watcher %s raised; restarting it from its committed offsets", self.spec.name)
                self._record_error(e)
                self.stop.wait(min(self.backoff_s * 2 ** (self.stats.errors - 1), self.backoff_max_s))

    def _consume(self, producer: RecordProducer) -> None:
        watcher, types = self.spec.build(), self.spec.record_types()
        namespace = self.topics.namespace
        with RecordConsumer(self.kafka, self.spec.topics(namespace), group_id=self.spec.group(namespace),
                            expect=types, rejected_topic=self.topics.rejected, producer=producer,
                            stage=f"watcher.{self.spec.name}") as consumer:
            while not self.stop.is_set():
                handled: dict[tuple[str, int], int] = {}
                try:
                    for m in consumer.poll_messages(timeout_ms=500):
                        # Counted before the call: a record that makes the watcher raise would raise
                        # again on every restart, so the restart begins after it.
                        handled[(m.topic, m.partition)] = m.offset + 1
                        try:
                            record = decode(m.value, expect=types)
                        except DecodeError:
                            self.stats.undecodable += 1
                            continue
                        self.stats.records += 1
                        for alert in as_alerts(watcher(record)):
                            producer.send(self.topics.metrics, alert_event(self.spec.name, alert, step_of(record)),
                                          key=COMPONENT)
                            self.stats.alerts += 1
                finally:
                    if handled:
                        consumer.commit(handled)  # flushes the alerts first

    def _record_error(self, error: BaseException) -> None:
        try:
            with RecordProducer(self.kafka) as producer:
                producer.send(self.topics.metrics, error_event(self.spec.name, error, self.stats.errors),
                              key=COMPONENT)
        except Exception:  # noqa: BLE001 — the broker itself is unreachable: the log has the error
            log.exception("watcher %s: could not publish its error", self.spec.name)


def run_watchers(entries: list[Entry], context: RunContext, stop: threading.Event) -> dict[str, WatcherStats]:
    """Run every watcher of the `watchers:` section until `stop` is set; returns what each one did."""
    loops = [WatcherLoop(spec, context.kafka, context.namespace, stop) for spec in watcher_specs(entries)]
    threads = [threading.Thread(target=loop.run, name=f"watcher-{loop.spec.name}", daemon=True) for loop in loops]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {loop.spec.name: loop.stats for loop in loops}
