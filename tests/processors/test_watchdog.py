"""A wedged processor worker exits with STALLED (to be restarted) and says where it waited; a
partition whose commits are stuck behind what the worker read is found (and read again)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from processors.commits import CommitWatch
from processors.watchdog import STALLED
from streams import RecordProducer, Topics
from tests.processors.helpers import exp
from tests.processors.test_broker import ROOT, start, stop

WEDGE = """
import asyncio, time
from processors.watchdog import Watchdog

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
    proc = subprocess.run([sys.executable, "-c", WEDGE.format(stall=1.0, idle=0.6)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == STALLED, proc.stderr
    assert "idle survived" in proc.stdout
    assert "stalled: a batch of 3 records unfinished after" in proc.stderr
    assert "main" in proc.stderr  # the waiting coroutine's stack is printed
    assert time.monotonic() - t0 < 30


def test_start_up_that_never_finishes_is_a_stall():
    code = "from processors.watchdog import Watchdog; import time; Watchdog(0.5).start(); time.sleep(30)"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == STALLED
    assert "stalled: start-up unfinished" in proc.stderr


@pytest.mark.broker
@pytest.mark.slow
def test_a_worker_wedged_by_a_plugin_exits_to_be_restarted(kafka, namespace, tmp_path):
    proc = start(tmp_path, namespace, pipeline=[{"name": "tests.hostile.processor_plugins.hang_on"}, "reshape"],
                 stall_timeout_s=20.0)
    try:
        with RecordProducer(kafka) as p:
            for e in [exp("ok", 0, 1, 1.0), exp("stuck", 0, 1, 1.0, text="hang")]:
                p.send(Topics(namespace).raw, e, key=e.group_id)
        assert proc.wait(120) == STALLED
    finally:
        stop(proc)
    log = (tmp_path / "process-1.log").read_text()
    assert "processor worker stalled: a batch of" in log
    assert "hang_on" in log  # the thread dump shows where it hung


def test_commit_watch_names_a_partition_whose_read_record_is_never_committed():
    watch = CommitWatch(stall_s=10)
    assert watch.stuck({"p0": 5, "p1": None}, {"p0": None}, now=0.0) == []   # read 5, nothing committed yet
    assert watch.stuck({"p0": 9}, {"p0": 6}, now=5.0) == []                  # 5 committed: now waiting on 9
    assert watch.stuck({"p0": 9}, {"p0": 6}, now=14.0) == []
    (tp, why), = watch.stuck({"p0": 9}, {"p0": 6}, now=15.5)
    assert tp == "p0" and why.startswith("offset 9 was read 10 s ago")
    assert watch.stuck({"p0": 9}, {"p0": 6}, now=16.0) == []                  # reported once, then watched afresh


def test_commit_watch_is_quiet_for_an_idle_or_freshly_seeked_worker():
    watch = CommitWatch(stall_s=10)
    assert watch.stuck({"p0": 41}, {"p0": 42}, now=0.0) == []    # all read records committed
    assert watch.stuck({"p0": 42}, {"p0": 42}, now=100.0) == []  # after a seek read holds the committed offset
    assert watch.stuck({"p0": 42}, {"p0": 42}, now=200.0) == []
