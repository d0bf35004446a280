"""`undertow monitor`: the metrics topic written to TensorBoard, W&B (offline) and MLflow, read back
with each library; resuming after its last commit; a user's sink by dotted path; missing extras."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from undertow.infra.monitor import MissingExtra, Monitor, MonitorConfig, SinkContext, sinks
from undertow.infra.monitor.sinks import EXTRA
from undertow.infra.run.runner import Run
from undertow.infra.run.config import RunConfig
from undertow.schemas import MetricEvent
from undertow.streams import RunContext, Topics
from tests.helpers import ROOT, cli, produce
from tests.infra.sink_files import mlflow_points, tensorboard_points, wandb_points

T0 = 1_800_000_000.0


def trainer(version: int) -> MetricEvent:
    return MetricEvent(component="trainer", step=version, time=T0 + version,
                       values={"loss": 0.5 ** version, "reward_mean": 0.25 * version})


def worker(version: int) -> MetricEvent:  # generating with the version before the trainer's newest
    return MetricEvent(component="rollout-0", step=version - 1, time=T0 + version + 0.1,
                       values={"tokens_per_s": 100.0 * version})


def processors(dropped: float, at: float) -> MetricEvent:  # no step of its own
    return MetricEvent(component="processors", time=at, values={"clean.dropped": dropped}, labels={"worker": "w1"})


RESTART = MetricEvent(component="run", time=T0 + 4, values={"exit_code": -9.0},
                      labels={"event": "restart", "child": "trainer", "cause": "signal 9"})
SENT = [e for v in (1, 2, 3) for e in (trainer(v), worker(v), processors(float(v), T0 + v + 0.2))] + [RESTART]
# What every sink must hold, worked by hand: (tag, policy version, value); exact in float32 too.
EXPECTED = sorted(
    [("trainer/loss", 1, 0.5), ("trainer/loss", 2, 0.25), ("trainer/loss", 3, 0.125),
     ("trainer/reward_mean", 1, 0.25), ("trainer/reward_mean", 2, 0.5), ("trainer/reward_mean", 3, 0.75),
     ("rollout-0/tokens_per_s", 0, 100.0), ("rollout-0/tokens_per_s", 1, 200.0), ("rollout-0/tokens_per_s", 2, 300.0),
     # stepless events are plotted at the newest version reported before them
     ("processors/w1/clean.dropped", 1, 1.0), ("processors/w1/clean.dropped", 2, 2.0),
     ("processors/w1/clean.dropped", 3, 3.0), ("run/restart/trainer/exit_code", 3, -9.0)])


def send(kafka, namespace: str, events: list[MetricEvent]) -> None:
    produce(kafka, Topics(namespace).metrics, events, key_of=lambda e: e.component)


@pytest.mark.broker
def test_a_run_stage_monitor_fills_tensorboard_wandb_and_mlflow_with_the_same_numbers(kafka, namespace, tmp_path,
                                                                                      monkeypatch):
    run_dir = tmp_path / "demo-20261201-120000"
    run_dir.mkdir()
    raw = {"namespace": namespace, "model": {"source": "tiny"},
           "monitor": {"sinks": ["tensorboard", {"name": "wandb", "project": "undertow-test"}, "mlflow"],
                       "lag_every_s": None}}  # the exact points below; the lag events: tests/infra/test_scaling.py
    run = Run(RunConfig.model_validate(raw), raw, run_dir)
    run.kafka = kafka
    stage_file, _, _ = run._stage_config(0, None)  # the file `undertow run` hands `undertow monitor`
    assert yaml.safe_load(stage_file.read_text())["monitor"]["dir"] == str(run_dir)
    send(kafka, namespace, SENT)
    done = cli("monitor", str(stage_file), "--idle-timeout", "4", timeout=180)
    assert "wrote 13 values of 10 metric events" in done.stdout
    assert tensorboard_points(run_dir / "tensorboard" / "main") == EXPECTED
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # for our reader, as the sink sets it for itself
    assert mlflow_points(run_dir, run_dir.name, "main") == EXPECTED
    assert wandb_points(run_dir) == EXPECTED


class JsonLinesSink:
    """A user's sink, named in config by dotted path: appends each flushed scalar to a file."""

    def __init__(self, context: SinkContext, *, fail_on: str | None = None):
        self.path, self.fail_on, self.pending = context.directory / "points.jsonl", fail_on, []

    def write(self, scalars) -> None:
        self.pending += [[s.tag, s.step, s.value] for s in scalars]

    def flush(self) -> None:
        if any(tag == self.fail_on for tag, _, _ in self.pending):
            raise RuntimeError(f"sink down at {self.fail_on}")
        with self.path.open("a") as out:
            out.writelines(json.dumps(p) + "\n" for p in self.pending)
        self.pending = []

    def close(self) -> None:
        pass


def monitor_once(kafka, namespace: str, directory: Path, **sink_kwargs) -> Monitor:
    sink = {"name": "tests.infra.test_monitor.JsonLinesSink", **sink_kwargs}
    monitor = Monitor(MonitorConfig(sinks=[sink], dir=str(directory)), RunContext(namespace=namespace, kafka=kafka))
    monitor.run(stop=lambda: False, idle_timeout_s=2)
    return monitor


def points(directory: Path) -> list[list]:
    path = directory / "points.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.broker
def test_offsets_are_committed_after_the_write_and_a_restart_resumes_at_the_right_version(kafka, namespace, tmp_path):
    send(kafka, namespace, [trainer(1), processors(1.0, T0 + 1.5), trainer(2)])
    with pytest.raises(RuntimeError, match="sink down"):
        monitor_once(kafka, namespace, tmp_path, fail_on="trainer/loss")
    assert points(tmp_path) == []
    first = [["trainer/loss", 1, 0.5], ["trainer/reward_mean", 1, 0.25], ["processors/w1/clean.dropped", 1, 1.0],
             ["trainer/loss", 2, 0.25], ["trainer/reward_mean", 2, 0.5]]
    monitor_once(kafka, namespace, tmp_path)  # nothing was committed: everything is written now, once
    assert points(tmp_path) == first
    send(kafka, namespace, [processors(7.0, T0 + 2.5), trainer(3)])
    resumed = monitor_once(kafka, namespace, tmp_path)
    assert resumed.stats.replayed == 3 and resumed.stats.events == 2
    # after the restart the stepless event still lands at version 2, where the trainer had got to
    assert points(tmp_path) == first + [["processors/w1/clean.dropped", 2, 7.0], ["trainer/loss", 3, 0.125],
                                        ["trainer/reward_mean", 3, 0.75]]


def test_a_missing_library_names_the_extra_that_installs_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb now raises ImportError
    context = SinkContext(tmp_path, "r", "main", "ns")
    with pytest.raises(MissingExtra, match=r"'wandb'.*pip install 'undertow\[monitor\]'"):
        sinks.resolve("wandb")(context)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][EXTRA]
    assert {e.split("==")[0] for e in extras} == {"tensorboard", "wandb", "mlflow-skinny"}


def test_unknown_sinks_and_arguments_fail_when_the_config_is_read():
    with pytest.raises(ValueError, match=r"monitor.sinks\n.*monitor sink 'nope': unknown"):
        RunConfig.model_validate({"monitor": {"sinks": ["nope"]}})
    with pytest.raises(ValueError, match=r"'mlflow': unexpected argument\(s\) \['uri'\]"):
        RunConfig.model_validate({"monitor": {"sinks": [{"name": "mlflow", "uri": "x"}]}})


@pytest.mark.broker
def test_run_starts_a_monitor_only_when_the_section_names_sinks(monkeypatch, kafka, tmp_path):
    started = []

    class RecordingSupervisor:
        def __init__(self, *args, **kwargs):
            self.children = []

        def start(self, name, argv, env=None):
            started.append((name, argv[-1]))

        def stop(self, names=None, **timeouts):
            pass

    monkeypatch.setattr("undertow.infra.run.runner.Supervisor", RecordingSupervisor)
    monkeypatch.setattr(Run, "_watch", lambda self, sup, watch, recorder, drain: ("done", ""))
    for sinks_ in ([], ["tensorboard"]):
        started.clear()
        raw = {"namespace": "t-monitor-start", "model": {"source": "tiny"}, "monitor": {"sinks": sinks_}}
        run = Run(RunConfig.model_validate(raw), raw, tmp_path)
        run.kafka = kafka
        run._run_stage(0, None)
        names = [n for n, _ in started]
        assert ("monitor" in names) == bool(sinks_), names
    assert dict(started)["monitor"].endswith("stages/0-main.yaml")


@pytest.mark.broker
def test_a_stopped_monitor_first_writes_what_is_already_on_the_topic(kafka, namespace, tmp_path):
    send(kafka, namespace, [trainer(1), trainer(2)])
    monitor = Monitor(MonitorConfig(sinks=["tests.infra.test_monitor.JsonLinesSink"], dir=str(tmp_path)),
                      RunContext(namespace=namespace, kafka=kafka))
    stats = monitor.run(stop=lambda: True)  # SIGTERM from `undertow run` at the end of a stage
    assert stats.events == 2 and [p[:2] for p in points(tmp_path)] == [
        ["trainer/loss", 1], ["trainer/reward_mean", 1], ["trainer/loss", 2], ["trainer/reward_mean", 2]]
