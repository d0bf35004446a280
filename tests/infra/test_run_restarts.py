"""`undertow run`'s watch with the restart policy, on real child processes and the real broker:
crashes within the rate are restarted after their backoff, one more fails the stage, and each
restart with its cause reaches the metrics topic and metrics.jsonl."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from undertow.infra.report.metrics_log import MetricsRecorder, RunEvents, read_metrics
from undertow.infra.run.drain import Drain
from undertow.infra.run.runner import Run, StageWatch
from undertow.infra.run.config import RunConfig
from undertow.infra.run.supervisor import Supervisor
from undertow.schemas import MetricEvent
from undertow.streams import Topics
from tests.helpers import read_all, wait_for

pytestmark = [pytest.mark.broker]


def crashing(starts_file, crashes: int) -> list[str]:
    """A child that exits 3 on each of its first `crashes` starts, then runs until stopped."""
    script = (f"import sys, time; f = open({str(starts_file)!r}, 'a+'); f.write('x'); f.flush(); f.seek(0)\n"
              f"if len(f.read()) <= {crashes}: print('boom', flush=True); sys.exit(3)\n"
              "time.sleep(600)")
    return [sys.executable, "-c", script]


def trainer_done_after(log: Path, restarts: int | None) -> list[str]:
    """A trainer that finishes once the supervisor has scheduled the crashing child's restart number
    `restarts` (its log says so; None: never): the stage ends after the crashes it is meant to follow,
    however slow the machine."""
    seen = f"os.path.exists(p) and 'restart {restarts} in' in open(p).read()" if restarts else "False"
    return [sys.executable, "-c", f"import os, time\np = {str(log)!r}\nwhile not ({seen}):\n    time.sleep(0.05)"]


def watch_stage(kafka, namespace, tmp_path, policy: dict, crashes: int, trainer_after: int | None):
    config = RunConfig.model_validate({"namespace": namespace, "run": {"restarts": policy, "refresh_s": 0.1}})
    run = Run(config, {}, tmp_path)
    recorder = MetricsRecorder(kafka, namespace, tmp_path / "metrics.jsonl", labels={"stage": "main"})
    recorder.start()
    sup = Supervisor(tmp_path / "logs")
    events = RunEvents(kafka, namespace)
    watch = StageWatch(sup, config.run.restarts, events, "main")
    sup.start("processors", crashing(tmp_path / "starts", crashes))
    sup.start("trainer", trainer_done_after(tmp_path / "logs" / "processors.log", trainer_after))
    started = time.monotonic()
    try:
        status, message = run._watch(sup, watch, recorder, Drain(kafka, []))  # no feeder: never asked
    finally:
        sup.stop()
        events.close()
        published = lambda: len([m for m in read_all(kafka, Topics(namespace).metrics, MetricEvent) if m.component == "run"])
        recorded = lambda: len([r for r in read_metrics(tmp_path / "metrics.jsonl") if r["component"] == "run"])
        wait_for(lambda: recorded() == published() > 0, 60, "the recorder to write every run event",
                 state=lambda: f"{published()} on the topic, {recorded()} recorded")
        recorder.stop()
    return status, message, watch.outcome(status, 0.0, message), time.monotonic() - started


def test_five_quick_crashes_are_restarted_and_recorded(kafka, namespace, tmp_path):
    policy = {"max": 5, "window_s": 600, "backoff_s": 0.2, "backoff_max_s": 0.5}
    status, _, outcome, _ = watch_stage(kafka, namespace, tmp_path, policy, crashes=5, trainer_after=5)
    assert status == "done" and outcome.restarts == {"processors": 5}
    assert [c["backoff_s"] for c in outcome.crashes] == [0.2, 0.4, 0.5, 0.5, 0.5]
    assert {c["cause"] for c in outcome.crashes} == {"exit code 3"} and outcome.crashes[0]["log_line"] == "boom"
    assert outcome.restart_policy == policy
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["component"] == "run"]
    assert [r["event"] for r in rows] == ["restart_policy"] + ["restart"] * 5
    assert rows[0]["restart_max"] == 5 and rows[0]["stage"] == "main"
    assert rows[-1]["child"] == "processors" and rows[-1]["cause"] == "exit code 3" and rows[-1]["restarts"] == 5


def test_one_crash_past_the_rate_fails_the_stage(kafka, namespace, tmp_path):
    policy = {"max": 2, "window_s": 600, "backoff_s": 0.1, "backoff_max_s": 0.1}
    status, message, outcome, _ = watch_stage(kafka, namespace, tmp_path, policy, crashes=10, trainer_after=None)
    assert status == "failed" and "processors crashed 3 times within 600 s" in message and "boom" in message
    assert outcome.restarts == {"processors": 2} and outcome.crashes[-1]["backoff_s"] is None
    rows = [r for r in read_metrics(tmp_path / "metrics.jsonl") if r["component"] == "run"]
    assert rows[-1]["event"] == "restart_refused"


def test_a_long_backoff_does_not_hold_up_the_watch(kafka, namespace, tmp_path):
    policy = {"max": 5, "window_s": 600, "backoff_s": 30, "backoff_max_s": 30}
    status, _, outcome, seconds = watch_stage(kafka, namespace, tmp_path, policy, crashes=1, trainer_after=1)
    assert status == "done" and seconds < 30  # the trainer's end was seen while processors waited out 30 s
    assert outcome.crashes[0]["backoff_s"] == 30
