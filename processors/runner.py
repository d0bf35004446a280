"""The processor worker: the pure pipeline as the job of a stream worker, from experiences.raw to experiences.ready.

Group and dedupe state live in the worker's tables (raw bytes, changelogged), so a worker that restarts or
takes over a partition resumes the open groups of that partition. Every drop becomes a Rejected
record with stage and reason; counters go to the metrics topic; task pass rates to task-stats.
The worker itself (Faust, in-order delivery, commits after acks) is streams/faust/worker.py.
"""

from __future__ import annotations

import os
import socket
from typing import Callable

from undertow.schemas import Experience, MetricEvent, encode
from undertow.streams import RunContext, Topics
from undertow.streams.faust import App, DeadLetter, Send, SourceRecord, WorkerPlan, build_worker_app, run_app
from undertow.processors.config import ProcessorsConfig, processors_group
from undertow.processors.groups import Arrival
from undertow.processors.pipeline import Output, Pipeline
from undertow.processors.state import StageContext, StateStore


def build_app(cfg: ProcessorsConfig, context: RunContext, worker: str | None = None) -> App:
    """The processor app of the `processors:` section `cfg`: the pipeline on experiences.raw, ticked for
    timeouts, its counters reported."""
    namespace, topics = context.namespace, context.topics
    worker = worker or f"{socket.gethostname()}-{os.getpid()}"
    # The app id names the consumer group and the state changelogs: one per namespace, so that runs
    # sharing a cluster never share dedupe or group state.
    plan = WorkerPlan(app_id=processors_group(namespace, cfg.app_id), topics=topics, source=topics.raw,
                      expect=Experience, tables=("groups", "dedupe"), writes=(topics.ready, topics.task_stats),
                      batch_size=cfg.batch_size, batch_within_s=cfg.batch_within_s, tick_every_s=cfg.tick_every_s,
                      metrics_every_s=cfg.metrics_every_s, stall_timeout_s=cfg.stall_timeout_s,
                      resync_after_s=cfg.resync_after_s, idle_exit_s=cfg.idle_exit_s)

    def start(store: Callable[[str], StateStore]) -> PipelineJob:
        pipeline = Pipeline.from_config(cfg.pipeline, context=StageContext(store=store),
                                        group_timeout_s=cfg.group_timeout_s, on_timeout=cfg.on_timeout,
                                        max_open_groups=cfg.max_open_groups, stage_timeout_s=cfg.stage_timeout_s,
                                        max_hung_calls=cfg.max_hung_calls)
        return PipelineJob(pipeline, topics, worker)

    return build_worker_app(plan, context.kafka, start)


class PipelineJob:
    """The pipeline as a worker's job: arrivals in; ready records, dead letters and task statistics out."""

    def __init__(self, pipeline: Pipeline, topics: Topics, worker: str):
        self.pipeline, self.topics, self.worker = pipeline, topics, worker
        # A stage that may take seconds on a batch (a model scorer) says so: its batches run off the loop.
        self.runs_off_loop = any(getattr(s.impl, "runs_off_loop", False) for s in pipeline.stages)

    def handle(self, batch: list[SourceRecord]) -> list[Send | DeadLetter]:
        return self.outputs(self.pipeline.push([Arrival(r.record, r.partition, r.offset, r.value) for r in batch]))

    def tick(self) -> list[Send | DeadLetter]:
        return self.outputs(self.pipeline.tick())

    def wedged(self) -> str | None:
        """Why the worker should restart once this batch is committed (calls that hung hold threads)."""
        return self.pipeline.wedged()

    def metrics(self) -> MetricEvent:
        return MetricEvent(component="processors", values=self.pipeline.stats.values(), labels={"worker": self.worker})

    def outputs(self, out: Output) -> list[Send | DeadLetter]:
        sent: list[Send | DeadLetter] = [Send(self.topics.ready, a.experience.group_id.encode(), encode(a.experience))
                                         for a in out.ready]
        for d in out.dropped:
            exp = d.arrival.experience
            sent.append(DeadLetter(d.stage, d.reason, d.detail, original=encode(exp), key=exp.group_id.encode(),
                                   record_id=exp.experience_id, partition=d.arrival.partition, offset=d.arrival.offset))
        sent += [Send(self.topics.task_stats, stat.task_id.encode(), encode(stat)) for stat in out.task_stats]
        return sent


def run_worker(cfg: ProcessorsConfig, context: RunContext, worker: str | None = None) -> None:
    """Run one worker until SIGTERM/SIGINT (or `idle_exit_s` without records)."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run_app(build_app(cfg, context, worker), cfg.stop_timeout_s)
