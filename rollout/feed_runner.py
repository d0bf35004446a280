"""`undertow feed`: the task sampler's tasks onto `<ns>.tasks`, with the rollout group's lag bounded.

Backpressure is pull-based: the feeder publishes only while the rollout group's lag (tasks on the
topic past the group's committed offsets) is below `max_lag`, so the topic never holds more than
`max_lag` waiting tasks and fresh pass rates can steer the next draws.

A restarted feeder continues after the last task it published, found from the records on the
topic (task ids carry their draw index); records it cannot decode or did not write are ignored.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Iterator

from undertow.schemas import DecodeError, MetricEvent, Task, TaskStat, decode
from undertow.streams import GroupLag, KafkaSettings, RecordConsumer, RecordProducer, RunContext
from undertow.streams.consumer import read_to_end

from undertow.rollout.config import FeederConfig, rollout_group
from undertow.rollout.feeder import TaskSampler, load_items
from undertow.rollout.feeder.sampler import Taskset

log = logging.getLogger(__name__)
METRICS_EVERY_S = 10.0


def build_sampler(cfg: FeederConfig) -> TaskSampler:
    tasksets = [Taskset(name=t.name, items=load_items(t.source), ratio=t.ratio,
                        group_size=t.group_size or cfg.group_size) for t in cfg.tasksets]
    return TaskSampler(tasksets, seed=cfg.seed, epochs=cfg.epochs, selector=cfg.selector)


@dataclass
class FeedStats:
    published: int = 0
    pauses: int = 0
    stats_read: int = 0
    metrics_sent: int = 0


class Feeder:
    """Publishes tasks until the sampler runs dry, `max_tasks` are out, or `stop` is set."""

    def __init__(self, cfg: FeederConfig, run: RunContext):
        settings = run.kafka
        self.cfg, self.topics, self.settings = cfg, run.topics, settings
        self.sampler = build_sampler(cfg)
        self.producer = RecordProducer(settings)
        self.lag = GroupLag(settings, self.topics.tasks, rollout_group(run.namespace, cfg.consumer_group))
        self.task_stats: RecordConsumer[TaskStat] = RecordConsumer(
            settings, [], group_id=None, expect=TaskStat, rejected_topic=self.topics.rejected,
            producer=self.producer, stage="feeder")
        self.task_stats.assign(self.topics.task_stats, "earliest")
        self.stats = FeedStats()
        self._metrics_due = 0.0

    def run(self, *, max_tasks: int | None = None, stop: threading.Event | None = None) -> FeedStats:
        stop = stop or threading.Event()
        self._skip_published()
        try:
            while not stop.is_set() and (max_tasks is None or self.stats.published < max_tasks):
                self._read_task_stats()
                if self.lag() >= self.cfg.max_lag:
                    self.stats.pauses += 1
                    stop.wait(self.cfg.poll_seconds)
                    continue
                task = self.sampler.next()
                if task is None:
                    break
                self.producer.send(self.topics.tasks, task, key=task.task_id)
                self.producer.flush()  # the lag check must see it
                self.stats.published += 1
        finally:
            self.close()
        return self.stats

    def close(self) -> None:
        self._send_pass_rates(force=True)
        self.producer.flush()
        self.task_stats.close()
        self.producer.close()
        self.lag.close()

    def _skip_published(self) -> None:
        """Continue after the tasks this feeder already published (a resumed run), instead of drawing
        them again: a finite taskset is not done twice, and experience ids stay new."""
        scan = TopicScan()
        drawn = self.sampler.published_draws(scan.tasks(self.settings, self.topics.tasks))
        skipped = self.sampler.skip(drawn)
        if scan.records:
            log.info("feeder: %d record(s) on %s, %d undecodable; %d draw(s) already published, continuing "
                     "after them", scan.records, self.topics.tasks, scan.undecodable, skipped)

    def _read_task_stats(self) -> None:
        if not self.sampler.uses_pass_rates:
            return
        for delivery in self.task_stats.poll(timeout_ms=0):
            self.sampler.update(delivery.record)
            self.stats.stats_read += 1
        self._send_pass_rates()

    def _send_pass_rates(self, force: bool = False) -> None:
        """Each taskset's pass rate so far on the metrics topic (the report's curriculum panel), every
        METRICS_EVERY_S while reports come in, and once at the end."""
        if not force and time.monotonic() < self._metrics_due:  # checked per task: the sum over items waits
            return
        rates = self.sampler.pass_rates()
        if not rates:
            return
        self._metrics_due = time.monotonic() + METRICS_EVERY_S
        self.producer.send(self.topics.metrics, MetricEvent(
            component="feeder", step=self.stats.published,
            values={f"{name}/pass_rate": rate for name, rate in rates.items()}), key="feeder")
        self.stats.metrics_sent += 1


@dataclass
class TopicScan:
    """Reads a topic once from its beginning to its end offsets of now, counting what it reads."""

    records: int = 0
    undecodable: int = 0

    def tasks(self, settings: KafkaSettings, topic: str) -> Iterator[Task]:
        """Every record on `topic` that decodes as a Task; the others are counted and passed over."""
        for value in read_to_end(settings, topic):
            self.records += 1
            try:
                yield decode(value or b"", expect=Task)
            except DecodeError:
                self.undecodable += 1
