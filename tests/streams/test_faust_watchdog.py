"""A wedged processor worker exits with STALLED (to be restarted) and says where it waited."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from undertow.streams.faust.watchdog import STALLED
from undertow.schemas import Experience, Rejected
from undertow.streams import RecordProducer, Topics
from tests.helpers import exp, read_all, wait_for
from tests.processors.test_broker import ROOT, read, start, stop

HANG = "tests.hostile.processor_plugins.hang_on"
DEAF = """
import asyncio, sys
from undertow.streams import KafkaSettings
from undertow.streams.faust.app import create_app
from undertow.streams.faust.worker import run_app

app = create_app(sys.argv[1], KafkaSettings().with_env())

@app.task
async def deaf_to_cancel() -> None:
    print("started", flush=True)
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass  # the worker's stop waits for this task, and it never ends

run_app(app, stop_timeout_s={timeout})
"""
WEDGE = """
import asyncio, time
from undertow.streams.faust.watchdog import Watchdog

async def main():
    dog = Watchdog({stall})
    dog.start()
    dog.ready()
    with dog.busy("a batch of 3 records"):
        await asyncio.sleep({idle})  # slow but finishing work is not a stall
    await asyncio.sleep({idle})  # neither is waiting for records
    print("idle survived", flush=True)
    with dog.busy("a batch of 3 records"):
        await asyncio.Event().wait()  # an await that never returns

asyncio.run(main())
"""


def test_a_stalled_batch_exits_with_stalled_and_a_report():
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", WEDGE.format(stall=2.0, idle=0.6)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == STALLED, proc.stderr
    assert "idle survived" in proc.stdout
    assert "stalled: a batch of 3 records unfinished after" in proc.stderr
    assert "main" in proc.stderr  # the waiting coroutine's stack is printed
    assert time.monotonic() - t0 < 30


def test_start_up_that_never_finishes_is_a_stall():
    code = "from undertow.streams.faust.watchdog import Watchdog; import time; Watchdog(0.5).start(); time.sleep(30)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == STALLED
    assert "stalled: start-up unfinished" in proc.stderr


@pytest.mark.broker
@pytest.mark.slow
def test_a_hanging_plugin_times_out_and_a_worker_left_with_hung_calls_commits_and_restarts(kafka, namespace, tmp_path):
    """The hanging record goes to the rejected topic with reason `timeout`; once calls left hanging reach
    `max_hung_calls` the worker commits and exits STALLED, and the restarted one reads on past them."""
    section = dict(pipeline=[{"name": HANG}, "reshape"], stage_timeout_s=0.5, max_hung_calls=2, stall_timeout_s=20.0)
    topics = Topics(namespace)
    proc = start(tmp_path, namespace, **section)
    try:
        with RecordProducer(kafka) as p:
            for e in [exp("ok", 0, 1, 1.0), exp("stuck-1", 0, 1, 1.0, text="hang")]:
                p.send(topics.raw, e, key=e.group_id)
            p.flush()
            # The second hang in a batch of its own: the first has timed out (one call left hanging).
            wait_for(lambda: any(r.record_id == "stuck-1/0" for r in read_all(kafka, topics.rejected, Rejected)), 60,
                     "stuck-1/0 timed out and rejected", proc=proc, every=0.5)
            p.send(topics.raw, exp("stuck-2", 0, 1, 1.0, text="hang"), key="stuck-2")
        assert proc.wait(120) == STALLED  # without the deadline it would hang until the watchdog's 20 s
    finally:
        stop(proc)
    first = (tmp_path / "process-1.log").rename(tmp_path / "first.log").read_text()
    assert "processor calls hang past their 0.5 s deadline" in first
    proc = start(tmp_path, namespace, **section)
    try:
        with RecordProducer(kafka) as p:
            p.send(topics.raw, exp("ok-2", 0, 1, 1.0), key="ok-2")
        ready = read(kafka, topics.ready, Experience, 2, timeout=90)
        rejected = read(kafka, topics.rejected, Rejected, 2, timeout=30)
    finally:
        stop(proc)
    assert sorted(e.group_id for e in ready) == ["ok", "ok-2"]
    # Each hanging record rejected once: the restarted worker did not read them again.
    assert sorted((r.record_id, r.stage, r.reason) for r in rejected) == [("stuck-1/0", HANG, "timeout"),
                                                                          ("stuck-2/0", HANG, "timeout")]


@pytest.mark.broker
def test_a_stop_that_never_ends_is_given_up_with_a_report(kafka, namespace, tmp_path):
    """SIGTERM to a worker whose stop waits on a task that will not end: past `stop_timeout_s` it says
    where it waits and exits STALLED, instead of living on after its supervisor."""
    log = tmp_path / "worker.log"  # Faust logs what its tasks print
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-c", DEAF.format(timeout=3.0), f"deaf-{namespace}"], cwd=ROOT,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: "started" in log.read_text(), 120, "the worker's task to start", proc=proc,
                 state=lambda: log.read_text()[-2000:])
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
    finally:
        proc.kill()
    report = log.read_text()
    assert code == STALLED, report[-3000:]
    assert "processor worker's stop unfinished after 3 s" in report
    assert "deaf_to_cancel" in report  # the task it waits on, by name
