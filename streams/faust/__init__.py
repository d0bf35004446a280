"""Faust, the project's stream processor, bound to undertow's broker settings and delivery rules.

`build_worker_app` and `run_app` (worker.py) run a plain `WorkerJob` on batches of one topic, with
keyed tables, timers, and outputs (`Send`, `DeadLetter`) committed only once acknowledged: the
processors' runner is such a job. Under it: `create_app` and `RecordIO` (app.py) make apps and read
and write records; `TableStore` (tables.py) keeps keyed state in a changelogged table; `InOrder` and
`booked_consumer` (books.py) hand each record to an agent once and in offset order, commit only what
was published, and seek back the partitions that `DeliveryWatch` (delivery.py) finds a worker stopped
serving (`reread_stuck`); `Watchdog` (watchdog.py) exits a wedged worker to be restarted. Imported
only by Faust workers: a rollout worker imports nothing of Faust.
"""

from undertow.streams.faust.app import RecordIO, create_app, track_output_topics, track_topics
from undertow.streams.faust.books import InOrder, Verdict, booked_consumer, in_order, next_offsets, reread_stuck
from undertow.streams.faust.delivery import DeliveryWatch
from undertow.streams.faust.tables import TableStore
from undertow.streams.faust.watchdog import STALLED, Watchdog
from undertow.streams.faust.worker import (App, DeadLetter, Send, SourceRecord, WorkerJob, WorkerPlan, build_worker_app,
                                  fetch_bytes_per_partition, run_app)

__all__ = ["App", "DeadLetter", "DeliveryWatch", "InOrder", "RecordIO", "STALLED", "Send", "SourceRecord", "TableStore",
           "Verdict", "Watchdog", "WorkerJob", "WorkerPlan", "booked_consumer", "build_worker_app", "create_app",
           "fetch_bytes_per_partition", "in_order", "next_offsets", "reread_stuck", "run_app", "track_output_topics",
           "track_topics"]
