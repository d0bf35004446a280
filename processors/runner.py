"""The Faust runner: a thin agent around the pure pipeline, from experiences.raw to experiences.ready.

Group and dedupe state live in Faust tables (raw bytes, changelogged), so a worker that restarts or
takes over a partition resumes the open groups of that partition. Every drop becomes a Rejected
record with stage and reason; counters go to the metrics topic; task pass rates to task-stats.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from typing import Any

import faust

from schemas import Experience, MetricEvent, encode
from streams import KafkaSettings, Topics
from streams.admin import cluster_size, partition_count
from streams.faust import (DeliveryWatch, InOrder, RecordIO, TableStore, Watchdog, booked_consumer, create_app,
                           in_order, reread_stuck, track_output_topics)
from streams.topics import MAX_MESSAGE_BYTES
from processors.config import ProcessorsConfig
from processors.groups import Arrival
from processors.pipeline import Output, Pipeline
from processors.state import StageContext

log = logging.getLogger(__name__)


def fetch_bytes_per_partition(partitions: int) -> int:
    """How much one fetch takes of each partition: every partition must fit in one fetch response
    (aiokafka's 50 MiB), so a backlog's partitions drain in step. With 32 MiB, one response held two
    partitions' records and the others waited 15 s and more behind them; 1 MiB kept them in step but
    cost 40% of the throughput (3,500 against 5,800 records/s here), 8 MiB keeps both. A record
    larger than this still arrives whole (the broker returns a first record past the limit)."""
    return max(1 << 20, min(8 << 20, (48 << 20) // partitions))


def build_app(cfg: ProcessorsConfig, namespace: str, kafka: KafkaSettings, worker: str | None = None) -> faust.App:
    """The processor app: one agent on experiences.raw, timers for timeouts, metrics and idle exit."""
    topics = Topics(namespace)
    partitions = partition_count(kafka, topics.raw)
    # A short linger lets a batch's sends share produce requests; a linger of 0 measured slower here
    # (the first record leaves alone and the rest queue behind it).
    # The app id names the consumer group and the state changelogs: one per namespace, so that runs
    # sharing a cluster never share dedupe or group state.
    fetch_bytes = fetch_bytes_per_partition(partitions)
    app = create_app(cfg.app_id or f"{namespace}-processors", kafka, topic_partitions=partitions, topic_replication_factor=min(3, cluster_size(kafka)),
                     producer_linger=0.005, producer_max_batch_size=1 << 20, consumer_max_fetch_size=fetch_bytes)
    io = RecordIO(app, topics, stage="decode")
    tables = {name: app.Table(name, key_type=bytes, value_type=bytes, partitions=partitions) for name in ("groups", "dedupe")}
    stores = {name: TableStore(table, partitions) for name, table in tables.items()}
    pipeline = Pipeline.from_config(cfg.pipeline, context=StageContext(store=stores.__getitem__),
                                    group_timeout_s=cfg.group_timeout_s, on_timeout=cfg.on_timeout,
                                    max_open_groups=cfg.max_open_groups)
    worker = worker or f"{socket.gethostname()}-{os.getpid()}"
    last_record = [time.monotonic()]
    watchdog = Watchdog(cfg.stall_timeout_s).start()
    books = InOrder()
    # Ahead of a record offered to the stream: Faust's stream buffer and the batch being handled.
    watch = DeliveryWatch(cfg.resync_after_s, in_flight=2 * (app.conf.stream_buffer_maxsize + cfg.batch_size),
                          round_bytes=4 * partitions * fetch_bytes + 2 * MAX_MESSAGE_BYTES)
    app.transport.Consumer = booked_consumer(books, topics.raw, watch)  # before the worker creates its consumer

    @app.on_partitions_revoked.connect
    async def forget(sender: Any, revoked: set, **kwargs: Any) -> None:
        books.forget(revoked)
        watch.forget(revoked)

    @app.task
    async def started() -> None:  # runs once Faust has started every service and recovered the tables
        watchdog.ready()

    @app.agent(io.topic(topics.raw))
    async def process(stream: faust.StreamT) -> None:
        outputs = [topics.ready, topics.rejected, topics.task_stats, topics.metrics,
                   *(name for table in tables.values() for name in table.changelog_topic.topics)]
        await track_output_topics(app, outputs)
        async for events in stream.take_events(cfg.batch_size, within=cfg.batch_within_s):
            with watchdog.busy(f"a batch of {len(events)} records"):
                watch.took(len(events))
                arrivals = []
                for event in await in_order(app.consumer, books, events, log):
                    exp = await io.decode(event, expect=Experience)
                    if exp is not None:
                        arrivals.append(Arrival(exp, event.message.partition, event.message.offset, event.message.value))
                last_record[0] = time.monotonic()
                await publish(io, topics, pipeline.push(arrivals))
                books.published()

    @app.timer(cfg.tick_every_s)
    async def close_timed_out_groups() -> None:
        with watchdog.busy("closing timed-out groups"):
            await publish(io, topics, pipeline.tick())
        if cfg.idle_exit_s is not None and time.monotonic() - last_record[0] > cfg.idle_exit_s:
            await publish_metrics(io, topics, pipeline, worker)
            os.kill(os.getpid(), signal.SIGTERM)  # the worker's own handler shuts down cleanly

    @app.timer(5.0)  # asks the broker for end offsets: that can take a second on a busy machine
    async def check_deliveries() -> None:
        await reread_stuck(app, books, topics.raw, watch, log)

    @app.timer(cfg.metrics_every_s)
    async def report() -> None:
        await publish_metrics(io, topics, pipeline, worker)

    return app


async def publish(io: RecordIO, topics: Topics, out: Output) -> None:
    """Send what the pipeline produced (ready records, dead letters, task statistics) and wait until
    the broker has acknowledged all of it: only then may the batch's source offsets be committed."""
    # Straight to the producer: Faust's topic.send wraps each message in futures and callbacks that
    # cost more than encoding it; the returned delivery futures are awaited together below.
    send = io.app.producer.send
    pending = [await send(topics.ready, a.experience.group_id.encode(), encode(a.experience), None, None, None)
               for a in out.ready]
    for d in out.dropped:
        exp = d.arrival.experience
        pending.append(await io.reject(
            stage=d.stage, reason=d.reason, detail=d.detail, original=encode(exp), key=exp.group_id.encode(),
            source_topic=topics.raw if d.arrival.partition is not None else None, partition=d.arrival.partition,
            offset=d.arrival.offset, record_id=exp.experience_id))
    pending += [await send(topics.task_stats, stat.task_id.encode(), encode(stat), None, None, None)
                for stat in out.task_stats]
    await asyncio.gather(*pending)


async def publish_metrics(io: RecordIO, topics: Topics, pipeline: Pipeline, worker: str) -> None:
    values = pipeline.stats.values()
    values["decode.dropped"] = float(io.rejected - sum(sum(s.dropped.values()) for s in pipeline.stats.stages.values()))
    await io.send(topics.metrics, MetricEvent(component="processors", values=values, labels={"worker": worker}),
                  key="processors")


def run_worker(cfg: ProcessorsConfig, namespace: str, kafka: KafkaSettings, worker: str | None = None) -> None:
    """Run one worker until SIGTERM/SIGINT (or `idle_exit_s` without records)."""
    from faust.worker import Worker

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    app = build_app(cfg, namespace, kafka, worker)
    runner = Worker(app, loglevel="warning")
    # Faust's terminal spinner sets the root logger to DEBUG (it spins per log line): aiokafka then
    # formats a debug record per message sent, a tenth of the worker's time.
    runner.spinner = None
    runner.execute_from_commandline()
