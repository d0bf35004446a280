"""A run that failed resumes: its trainer SIGKILLed under a restart policy of 0 ends the run as
failed; `undertow run --resume` continues it from the trainer's checkpoint to its last step, the
feeder after the tasks it had published."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid

import pytest
import yaml

from tests.audit import audit
from tests.e2e.test_loop import ROOT, trainer_rows, undertow_run
from tests.run_output import stop_run, wait_for_step, wait_run

pytestmark = [pytest.mark.broker, pytest.mark.slow]
STEPS, KILL_AT = 30, 12


def test_a_failed_run_resumes_and_finishes(kafka, tmp_path):
    namespace = f"resume-{uuid.uuid4().hex[:6]}"
    cfg = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    cfg["namespace"] = namespace
    cfg["trainer"]["checkpoint_every"] = 5
    cfg["run"].update(stages=[], steps=STEPS, restarts={"max": 0})  # the first crash fails the run
    cfg["run"]["archive"] = False  # no archive and no evaluator: nothing here reads them, and the cores are few
    del cfg["eval"]
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"

    proc = undertow_run(str(config), "--runs-dir", str(runs))
    try:
        run_dir = wait_for_step(proc, runs, KILL_AT)
        os.killpg(int((run_dir / "logs" / "0-main" / "trainer.pid").read_text()), signal.SIGKILL)
        out = wait_run(proc, runs, timeout=180, code=1)
    finally:
        stop_run(proc)
    state = json.loads((run_dir / "run.json").read_text())
    assert state["status"] == "failed" and "trainer crashed 1 times" in out
    (crash,) = state["stages"][0]["crashes"]
    assert crash["component"] == "trainer" and crash["cause"] == "signal SIGKILL" and crash["backoff_s"] is None
    checkpoint = max(int(p.name.split("-")[1]) for p in (run_dir / "checkpoints" / namespace).glob("step-*"))
    assert checkpoint < STEPS

    resumed_at = time.time()
    resumed = undertow_run("--resume", str(run_dir))
    wait_run(resumed, runs, timeout=400)
    state = json.loads((run_dir / "run.json").read_text())
    assert state["status"] == "done" and state["stages"][0]["attempts"] == 2
    rows = trainer_rows(run_dir, "main")
    assert len({(r["version"], r["time"]) for r in rows}) == len(rows), "metrics.jsonl recorded events twice"
    steps = [r["version"] for r in rows if r["time"] >= resumed_at]
    assert steps and max(steps) == STEPS
    assert min(steps) == checkpoint + 1  # from the checkpoint, not from scratch
    books = audit(kafka, namespace, run_dir / "checkpoints" / namespace / "ledger.jsonl")
    assert books.tasks_published and not books.tasks_twice  # the resumed feeder drew nothing again
    assert not books.twice
