"""Entry points: `undertow feed` and `undertow rollout --workers 2` as subprocesses, config errors, examples."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from undertow.schemas import Experience, Task
from undertow.streams import Topics
from undertow.infra.run.config import load_component_config
from undertow.rollout.feed_runner import build_sampler
from tests.helpers import env, read_all

ROOT = Path(__file__).resolve().parents[2]
UNDERTOW = [sys.executable, "-m", "undertow.infra.cli"]


def test_every_shipped_rollout_example_loads_and_builds_its_tasksets(monkeypatch):
    monkeypatch.chdir(ROOT)
    examples = sorted(ROOT.glob("examples/rollout_*.yaml"))
    assert len(examples) == 2
    for path in examples:
        feeder = load_component_config(path).feeder
        task = build_sampler(feeder).next()
        assert task.taskset in {t.name for t in feeder.tasksets} and (task.prompt or task.messages), path


def test_bad_config_names_the_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("rollout:\n  sampling: {temperature: 0}\n  max_staleness: -1\nfeeder: {max_lag: 0}\n")
    out = subprocess.run(UNDERTOW + ["rollout", str(path), "-b", "localhost:1"], capture_output=True, text=True,
                         env=env(), cwd=ROOT, timeout=120)
    assert out.returncode == 2
    assert "rollout.sampling.temperature" in out.stderr and "rollout.max_staleness" in out.stderr
    assert "feeder.max_lag" in out.stderr  # one model for the whole file: every command finds every error
    out = subprocess.run(UNDERTOW + ["feed", str(path), "-b", "localhost:1"], capture_output=True, text=True,
                         env=env(), cwd=ROOT, timeout=120)
    assert out.returncode == 2 and "feeder.max_lag" in out.stderr and "greater than or equal to 1" in out.stderr


@pytest.mark.broker
@pytest.mark.slow
def test_feed_then_two_workers_in_one_group(kafka, namespace, config_path):
    path = config_path(
        feeder={"tasksets": [{"name": "a", "source": {"name": "arithmetic", "size": 8}}], "group_size": 2},
        rollout={"sampling": {"max_new_tokens": 4}, "workers": 1})
    fed = subprocess.run(UNDERTOW + ["feed", str(path)], capture_output=True, text=True, env=env(), cwd=ROOT,
                         timeout=300)
    assert fed.returncode == 0, fed.stderr
    assert "8 task(s) published" in fed.stdout
    topics = Topics(namespace)
    tasks = read_all(kafka, topics.tasks, Task)
    assert len(tasks) == 8
    work = subprocess.run(UNDERTOW + ["rollout", str(path), "--workers", "2", "--idle-timeout", "8"],
                          capture_output=True, text=True, env=env(), cwd=ROOT, timeout=400)
    assert work.returncode == 0, work.stderr[-3000:]
    exps = read_all(kafka, topics.raw, Experience)
    assert {e.task_id for e in exps} == {t.task_id for t in tasks}
    # One group, not two: each task was done once (two separate consumers would both do all 8).
    assert len(exps) == 16 and len({e.experience_id for e in exps}) == 16
    assert "rollout-0: WorkerStats" in work.stderr and "rollout-1: WorkerStats" in work.stderr
