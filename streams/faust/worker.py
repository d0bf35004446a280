"""A Faust worker that runs a plain job on batches of one source topic.

The job (`WorkerJob`) knows no Faust: it takes decoded records in offset order and returns what to
send (`Send`, `DeadLetter`). A job whose batches may take seconds (a reward model, an LLM judge) says so
(`runs_off_loop`): its calls then run one at a time on a thread of their own (`JobThread`), leaving the
event loop free for heartbeats, fetches, timers and acknowledgements; others run on the loop, which
is faster (the thread hop cost about a sixth of the throughput of a plain pipeline). The worker does the rest: decoding, keyed state in
changelogged tables, the in-order book and its commits (books.py), the delivery watch (delivery.py), the
watchdog (watchdog.py), the timers, and sending, where a batch's source offsets are committed only
once the broker has acknowledged everything the batch sent.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Protocol

import faust

from undertow.schemas import MetricEvent, Record
from undertow.streams.admin import cluster_size, partition_count
from undertow.streams.faust.app import RecordIO, create_app, track_output_topics
from undertow.streams.faust.books import InOrder, booked_consumer, in_order, reread_stuck
from undertow.streams.faust.delivery import DeliveryWatch
from undertow.streams.faust.tables import Change, TableStore
from undertow.streams.faust.watchdog import STALLED, Watchdog, print_where_it_waits
from undertow.streams.settings import KafkaSettings
from undertow.streams.topics import MAX_MESSAGE_BYTES, Topics

log = logging.getLogger(__name__)

App = faust.App  # what `build_worker_app` returns, named for callers that import no Faust
DECODE = "decode"  # the stage of the records the worker dead-letters itself: the job never sees them


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """A decoded record of the source topic, with where it was read and its wire bytes."""

    record: Record
    partition: int
    offset: int
    value: bytes


@dataclass(frozen=True, slots=True)
class Send:
    """Bytes for `topic` under `key`."""

    topic: str
    key: bytes | None
    value: bytes


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A record the job refused, for the rejected topic with its stage and reason. `partition` and
    `offset` say where the source topic holds it (None for a record not read from there)."""

    stage: str
    reason: str
    detail: str
    original: bytes
    key: bytes | None
    record_id: str | None
    partition: int | None = None
    offset: int | None = None


Outputs = list[Send | DeadLetter]
Changes = tuple[TableStore, list[Change]]  # a store and the changes a job call made to it


class WorkerJob(Protocol):
    """What a worker runs: each batch, each tick, and the metrics it reports. A job may set
    `runs_off_loop = True` when a batch may take seconds (its calls then run on a thread of their own)."""

    def handle(self, batch: list[SourceRecord]) -> Outputs: ...
    def tick(self) -> Outputs: ...
    def metrics(self) -> MetricEvent: ...  # called on the loop, maybe during a batch: it only reads


@dataclass(frozen=True)
class WorkerPlan:
    """A worker's topics, tables and pace."""

    app_id: str  # names the consumer group and the tables' changelogs
    topics: Topics  # the namespace's catalog: dead letters and metrics go to its topics
    source: str
    expect: type[Record] | tuple[type[Record], ...]  # the source's records; anything else is dead-lettered
    tables: tuple[str, ...]  # keyed byte tables, changelogged: the job's state stores
    writes: tuple[str, ...]  # the topics of the job's Sends
    batch_size: int  # records per `handle`, at most
    batch_within_s: float  # the longest wait to fill a batch
    tick_every_s: float
    metrics_every_s: float
    stall_timeout_s: float  # the watchdog's limit on start-up and on each batch or tick
    resync_after_s: float  # the delivery watch's limit on a worker offered nothing and handling nothing
    idle_exit_s: float | None = None  # stop after this long without a record; None: run until SIGTERM


class JobCalls:
    """Calls into the job, one at a time and in order, each returning what it sent and the changes it
    made to the stores, taken in the same step (tables.py: they are sent after those outputs).

    A job that `runs_off_loop` is called on a single thread beside the event loop: one thread keeps it
    single-threaded as it was on the loop (its state needs no locks). Others run on the loop itself."""

    def __init__(self, stores: list[TableStore], off_loop: bool):
        self.stores = stores
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="job") if off_loop else None

    def _call(self, fn: Callable[..., Outputs], *args: Any) -> tuple[Outputs, list[Changes]]:
        outputs = fn(*args)
        return outputs, [(store, store.take_changes()) for store in self.stores]

    async def __call__(self, fn: Callable[..., Outputs], *args: Any) -> tuple[Outputs, list[Changes]]:
        if self.pool is None:
            return self._call(fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._call, fn, *args)


def fetch_bytes_per_partition(partitions: int) -> int:
    """How much one fetch takes of each partition: every partition must fit in one fetch response
    (aiokafka's 50 MiB), so a backlog's partitions drain in step. With 32 MiB, one response held two
    partitions' records and the others waited 15 s and more behind them; 1 MiB kept them in step but
    cost 40% of the throughput (3,500 against 5,800 records/s here), 8 MiB keeps both. A record
    larger than this still arrives whole (the broker returns a first record past the limit)."""
    return max(1 << 20, min(8 << 20, (48 << 20) // partitions))


def build_worker_app(plan: WorkerPlan, kafka: KafkaSettings,
                     start: Callable[[Callable[[str], TableStore]], WorkerJob]) -> faust.App:
    """The worker's app: one agent on the source topic, timers for the job's tick, redelivery,
    metrics and idle exit. `start` builds the job on the app's tables (a lookup by name)."""
    partitions = partition_count(kafka, plan.source)
    # A short linger lets a batch's sends share produce requests; a linger of 0 measured slower here
    # (the first record leaves alone and the rest queue behind it).
    fetch_bytes = fetch_bytes_per_partition(partitions)
    app = create_app(plan.app_id, kafka, topic_partitions=partitions, topic_replication_factor=min(3, cluster_size(kafka)),
                     producer_linger=0.005, producer_max_batch_size=1 << 20, consumer_max_fetch_size=fetch_bytes)
    io = RecordIO(app, plan.topics, stage=DECODE)
    tables = {name: app.Table(name, key_type=bytes, value_type=bytes, partitions=partitions) for name in plan.tables}
    stores = {name: TableStore(table, partitions) for name, table in tables.items()}
    job = start(stores.__getitem__)
    call = JobCalls(list(stores.values()), off_loop=getattr(job, "runs_off_loop", False))
    last_record, undecodable = time.monotonic(), 0
    watchdog = Watchdog(plan.stall_timeout_s).start()
    books = InOrder()
    # Ahead of a record offered to the stream: Faust's stream buffer and the batch being handled.
    watch = DeliveryWatch(plan.resync_after_s, in_flight=2 * (app.conf.stream_buffer_maxsize + plan.batch_size),
                          round_bytes=4 * partitions * fetch_bytes + 2 * MAX_MESSAGE_BYTES)
    app.transport.Consumer = booked_consumer(books, plan.source, watch)  # before the worker creates its consumer

    async def report() -> None:
        event = job.metrics()  # not behind a slow batch: the metrics show a worker at work
        event.values[f"{DECODE}.dropped"] = float(undecodable)
        await io.send(plan.topics.metrics, event, key=event.component)

    @app.on_partitions_revoked.connect
    async def forget(sender: Any, revoked: set, **kwargs: Any) -> None:
        books.forget(revoked)
        watch.forget(revoked)

    @app.task
    async def started() -> None:  # runs once Faust has started every service and recovered the tables
        watchdog.ready()

    @app.agent(io.topic(plan.source))
    async def process(stream: faust.StreamT) -> None:
        nonlocal last_record, undecodable
        outputs = [*plan.writes, plan.topics.rejected, plan.topics.metrics,
                   *(name for table in tables.values() for name in table.changelog_topic.topics)]
        await track_output_topics(app, outputs)
        async for events in stream.take_events(plan.batch_size, within=plan.batch_within_s):
            with watchdog.busy(f"a batch of {len(events)} records"):
                watch.took(len(events))
                batch = []
                for event in await in_order(app.consumer, books, events, log):
                    record = await io.decode(event, expect=plan.expect)
                    if record is None:
                        undecodable += 1
                    else:
                        m = event.message
                        batch.append(SourceRecord(record, m.partition, m.offset, m.value))
                last_record = time.monotonic()
                await send_all(io, plan.source, *await call(job.handle, batch))
                books.published()
                await restart_if_wedged(app, plan.source, job, watchdog)

    @app.timer(plan.tick_every_s)
    async def tick() -> None:
        with watchdog.busy("a tick"):
            await send_all(io, plan.source, *await call(job.tick))
        if plan.idle_exit_s is not None and time.monotonic() - last_record > plan.idle_exit_s:
            await report()
            os.kill(os.getpid(), signal.SIGTERM)  # the worker's own handler shuts down cleanly

    @app.timer(5.0)  # asks the broker for end offsets: that can take a second on a busy machine
    async def check_deliveries() -> None:
        await reread_stuck(app, books, plan.source, watch, log)

    @app.timer(plan.metrics_every_s)
    async def report_metrics() -> None:
        await report()

    return app


async def send_all(io: RecordIO, source: str, outputs: Outputs, changes: list[Changes]) -> None:
    """Send a job call's outputs and wait until the broker has acknowledged all of them: only then may
    the batch's source offsets be committed, and only then go the state changes the call made."""
    # Straight to the producer: Faust's topic.send wraps each message in futures and callbacks that
    # cost more than encoding it; the returned delivery futures are awaited together below.
    send = io.app.producer.send
    pending = []
    for out in outputs:
        if isinstance(out, Send):
            pending.append(await send(out.topic, out.key, out.value, None, None, None))
        else:
            pending.append(await io.reject(
                stage=out.stage, reason=out.reason, detail=out.detail, original=out.original, key=out.key,
                source_topic=source if out.partition is not None else None, partition=out.partition,
                offset=out.offset, record_id=out.record_id))
    await asyncio.gather(*pending)
    for store, made in changes:
        await store.send(made)


async def restart_if_wedged(app: faust.App, source: str, job: WorkerJob, watchdog: Watchdog) -> None:
    """A job whose calls hung past their deadline holds threads Python cannot stop: once it has too many
    (`job.wedged()` says why), commit what was handled (the hung records are dead-lettered) and exit to
    be restarted fresh."""
    why = getattr(job, "wedged", lambda: None)()
    if why:
        # Faust's own commit only covers partitions whose events it saw acknowledged, and this batch's are
        # not yet: commit the source's partitions as the book allows (books.py's consumer).
        consumer = app.consumer
        await consumer._commit_tps([tp for tp in consumer.assignment() if tp.topic == source], start_new_transaction=False)
        watchdog.fail(why)


def run_app(app: faust.App, stop_timeout_s: float) -> None:
    """Run the app's worker until SIGTERM/SIGINT (or its idle exit). A stop that has not ended
    `stop_timeout_s` after the signal prints where it waits and ends the process (code STALLED)."""
    from faust.worker import Worker

    class BoundedStopWorker(Worker):
        # mode's Worker (mode-streaming 0.7.1) turns SIGTERM and SIGINT into this one call. Its stop
        # can wait forever: a service thread of Faust's consumer was seen never to stop when two
        # workers stopped at once. Nothing is lost by leaving then: what the worker handled and did
        # not commit is read again by the partitions' next owner, and dedupe drops what it had sent.
        def _schedule_shutdown(self, signum: signal.Signals) -> None:
            if not self._signal_stop_time:
                threading.Thread(target=end_a_stuck_stop, args=(stop_timeout_s,), name="stop-timeout",
                                 daemon=True).start()
            super()._schedule_shutdown(signum)

    runner = BoundedStopWorker(app, loglevel="warning")
    # Faust's terminal spinner sets the root logger to DEBUG (it spins per log line): aiokafka then
    # formats a debug record per message sent, a tenth of the worker's time.
    runner.spinner = None
    runner.execute_from_commandline()


def end_a_stuck_stop(timeout_s: float) -> None:
    """Wait `timeout_s` (the process normally exits first), then report every loop's tasks and exit."""
    time.sleep(timeout_s)
    loops = [o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and not o.is_closed()]
    try:
        print_where_it_waits(f"processor worker's stop unfinished after {timeout_s:g} s; exiting with code "
                             f"{STALLED} (what it did not commit is read again)", loops)
    finally:
        os._exit(STALLED)
