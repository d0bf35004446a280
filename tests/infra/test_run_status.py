"""`undertow status RUN_DIR`: a finished run from its directory (run.json, metrics.jsonl, archive),
a live one from its broker with every stage's namespace, and the running run found with no argument."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from undertow.infra.run.status import find_running_run, run_status
from undertow.schemas import Rejected
from undertow.streams import BOOTSTRAP_ENV, RunContext, Topics, create_topics
from undertow.streams.archive import ArchiveConfig, Archiver
from tests.helpers import ROOT, env, exp, produce

pytestmark = [pytest.mark.broker]


def make_run(base, namespace: str, status: str, stage: int) -> object:
    run_dir = base / f"demo-{status}"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({
        "namespace": namespace, "model": {"source": "tiny"},
        "run": {"stages": [{"name": "warmup", "steps": 2}, {"name": "rl", "steps": 3}]}}))
    stages = [{"name": "warmup", "status": "done", "seconds": 12.0, "restarts": {}, "attempts": 1}]
    if status == "done":
        stages.append({"name": "rl", "status": "done", "seconds": 30.4, "restarts": {"trainer": 1, "rollout": 1},
                       "attempts": 2})
    (run_dir / "run.json").write_text(json.dumps({"stage": stage, "status": status, "stages": stages}))
    rows = [{"stage": "warmup", "component": "trainer", "step": s, "time": 1.0 + s, "reward_mean": 0.1 * s}
            for s in (1, 2)]
    rows += [{"stage": "rl", "component": "trainer", "step": s, "time": 10.0 + s, "reward_mean": r}
             for s, r in ((1, 0.25), (2, 0.5), (3, 0.625))]
    rows += [{"stage": "rl", "component": "rollout-0", "step": 2, "time": 12.5, "reward_mean": 0.9}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run_dir


def test_a_finished_run_is_read_from_its_directory_and_archive(kafka, namespace, tmp_path, monkeypatch):
    run_dir = make_run(tmp_path, namespace, "done", 2)
    rl = f"{namespace}-rl"
    create_topics(kafka, rl)
    produce(kafka, Topics(rl).ready, [exp(f"g{i}", 0, 1) for i in range(5)])
    produce(kafka, Topics(rl).rejected, [Rejected.of("trainer", "stale", b"x", record_id=f"r{i}") for i in range(2)],
            key_of=lambda r: r.record_id)
    Archiver(ArchiveConfig(root=str(run_dir / "archive")), RunContext(namespace=rl, kafka=kafka)).run(lambda: False, idle_timeout_s=3)
    monkeypatch.delenv(BOOTSTRAP_ENV)  # the run is over: its broker is gone
    st = run_status(run_dir)
    assert (st.status, st.bootstrap, st.live) == ("done", None, {})
    warmup, rl_stage = st.stages
    assert (warmup.namespace, warmup.metric_events, warmup.trainer_version, warmup.reward_mean) == (
        f"{namespace}-warmup", 2, 2, 0.2)
    assert (rl_stage.status, rl_stage.seconds, rl_stage.attempts, rl_stage.restarts) == ("done", 30.4, 2, 2)
    assert (rl_stage.metric_events, rl_stage.trainer_version, rl_stage.reward_mean) == (4, 3, 0.625)
    assert (warmup.archived, rl_stage.archived) == ({}, {"experiences": 5, "rejected": 2, "metrics": 0})


def test_a_live_run_shows_every_stage_namespace_and_is_found_without_an_argument(kafka, namespace, tmp_path):
    runs = tmp_path / "runs"
    run_dir = make_run(runs, namespace, "running", 1)
    stale = make_run(runs, f"{namespace}-old", "interrupted", 1)
    stale.rename(runs / "demo-killed")
    state = json.loads((runs / "demo-killed" / "run.json").read_text())
    (runs / "demo-killed" / "run.json").write_text(json.dumps({**state, "status": "running"}))
    (runs / "demo-killed" / "broker").mkdir()  # its own broker died with it: not the running run
    for stage in ("warmup", "rl"):
        create_topics(kafka, f"{namespace}-{stage}")
    produce(kafka, Topics(f"{namespace}-rl").ready, [exp(f"g{i}", 0, 1) for i in range(3)])
    assert find_running_run(runs) == run_dir
    st = run_status(run_dir)
    assert st.bootstrap == kafka.bootstrap_servers and [s.status for s in st.stages] == ["done", "running"]
    assert st.live[f"{namespace}-rl"].records[Topics(f"{namespace}-rl").ready] == 3
    assert st.live[f"{namespace}-warmup"].records[Topics(f"{namespace}-warmup").ready] == 0
    done = subprocess.run([sys.executable, "-m", "undertow.infra.cli", "status"], cwd=tmp_path, capture_output=True, text=True,
                          env=env(PYTHONPATH=str(ROOT), COLUMNS="200"), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "run demo-running: running" in done.stdout
    assert f"{namespace}-warmup" in done.stdout and f"{namespace}-rl.experiences.ready" in done.stdout
