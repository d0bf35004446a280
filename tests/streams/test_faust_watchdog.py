"""A wedged processor worker exits with STALLED (to be restarted) and says where it waited."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from undertow.streams.faust.watchdog import STALLED
from undertow.streams import RecordProducer, Topics
from tests.helpers import exp
from tests.processors.test_broker import ROOT, start, stop

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
    proc = subprocess.run([sys.executable, "-c", WEDGE.format(stall=1.0, idle=0.6)], cwd=ROOT,
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
