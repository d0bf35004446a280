"""The autoscaling signal's numbers, worked by hand."""

from __future__ import annotations

import json

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.structs import OffsetAndMetadata
from typer.testing import CliRunner

from tests.helpers import produce, read_all
from undertow.infra.cli import app
from undertow.infra.monitor import Monitor, MonitorConfig
from undertow.infra.monitor.lag import lag_values, short_name
from undertow.infra.report.namespace import LagReading, NamespaceStatus
from undertow.infra.report.scaling import lag_report, trainer_wait_fraction
from undertow.rollout.config import rollout_group
from undertow.schemas import MetricEvent, Task
from undertow.streams import RunContext, Topics


def test_wait_fraction_is_recent_waiting_over_recent_wall_time():
    rows = [{"component": "trainer", "time": t, "wait_s": w} for t, w in ((10, 0.5), (12, 1.0), (15, 1.5), (16, 0.5))]
    rows.insert(2, {"component": "rollout-0", "time": 13, "wait_s": 9.0})  # another component's wait is not the trainer's
    # steps at 10..16 span 6 s; the waits between them: 1.0 + 1.5 + 0.5 = 3.0 s -> 0.5
    assert trainer_wait_fraction(rows) == 0.5
    # the last 2 steps (times 12..16): 1.5 + 0.5 over 4 s; the last one (15..16): 0.5 over 1 s
    assert trainer_wait_fraction(rows, window=2) == 0.5 and trainer_wait_fraction(rows, window=1) == 0.5
    rows[-1]["wait_s"] = 0.0  # then the last step waited nothing: 1.5 over 4 s, and 0 over 1 s
    assert (trainer_wait_fraction(rows, window=2), trainer_wait_fraction(rows, window=1)) == (0.375, 0.0)
    assert trainer_wait_fraction(rows[:1]) is None


def test_lag_is_summed_per_group_and_the_largest_per_topic():
    status = NamespaceStatus({"n.tasks": 100, "n.experiences.raw": 40}, [
        LagReading("n.rollout", "n.tasks", 70, 100), LagReading("n-processors", "n.experiences.raw", 25, 40),
        LagReading("n-archive", "n.experiences.raw", 40, 40), LagReading("n-archive", "n.tasks", 90, 100)], 3)
    out = lag_report(status)
    assert {g: v["lag"] for g, v in out["groups"].items()} == {"n.rollout": 30, "n-processors": 15, "n-archive": 10}
    assert out["topic_lag"] == {"n.tasks": 30, "n.experiences.raw": 15} and out["policy_version"] == 3


def test_lag_metric_names_drop_the_namespace():
    status = NamespaceStatus({}, [LagReading("n.rollout", "n.tasks", 70, 100),
                                  LagReading("n-processors", "n.experiences.raw", 25, 40),
                                  LagReading("undertow-trainer", "n.experiences.ready", 5, 8),
                                  LagReading("proc-n", "n.experiences.raw", 39, 40)], None)
    assert lag_values(lag_report(status), "n") == {
        "group.rollout": 30.0, "group.processors": 15.0, "group.proc": 1.0,  # an app_id `proc-<namespace>`
        "group.undertow-trainer": 3.0,  # no namespace in it: as is
        "topic.tasks": 30.0, "topic.experiences.raw": 15.0, "topic.experiences.ready": 3.0}


def test_status_json_of_a_run_directory_gives_the_trainers_wait_fraction(tmp_path):
    run_dir = tmp_path / "demo-1"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text("namespace: scaling-json\nmodel: {source: tiny}\n")
    (run_dir / "run.json").write_text(json.dumps({"stage": 0, "status": "done", "stages": []}))
    rows = [{"stage": "main", "component": "trainer", "step": i + 1, "time": t, "wait_s": w}
            for i, (t, w) in enumerate(((10, 0.5), (12, 1.0), (15, 1.5), (16, 0.5)))]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = CliRunner().invoke(app, ["status", str(run_dir), "--json"], env={"UNDERTOW_BOOTSTRAP": ""})
    assert done.exit_code == 0, done.output
    signal = json.loads(done.stdout)
    # 3.0 s waited over the 6 s from the first step to the last (worked in the test above)
    assert signal["trainer_wait_fraction"] == 0.5 and signal["run"] == "demo-1" and signal["status"] == "done"


@pytest.mark.broker
def test_the_monitor_publishes_the_lag_status_json_gives(kafka, namespace, tmp_path):
    """The lag event on the metrics topic (infra/monitor/lag.py) carries the numbers of `status --json`,
    and the sinks get them as `lag/...` scalars."""
    topics = Topics(namespace)
    produce(kafka, topics.tasks, [Task(task_id=f"t{i}", prompt="1+1=") for i in range(10)], key_of=lambda t: t.task_id)
    committer = KafkaConsumer(**kafka.kafka_python(), group_id=rollout_group(namespace), enable_auto_commit=False)
    try:  # the rollout group has done 1 task of partition 0 and none elsewhere: lag 9 (partitions it never
        # committed count from their beginning)
        committer.commit({TopicPartition(topics.tasks, 0): OffsetAndMetadata(1, "", -1)})
    finally:
        committer.close()
    # the trainer's steps of the unit test above: wait fraction 0.5
    produce(kafka, topics.metrics, [MetricEvent(component="trainer", step=i + 1, time=t, values={"wait_s": w})
                                    for i, (t, w) in enumerate(((10, 0.5), (12, 1.0), (15, 1.5), (16, 0.5)))],
            key_of=lambda e: e.component)
    monitor = Monitor(MonitorConfig(sinks=["tests.infra.test_monitor.JsonLinesSink"], dir=str(tmp_path),
                                    lag_every_s=0.5), RunContext(namespace=namespace, kafka=kafka))
    monitor.run(stop=lambda: False, idle_timeout_s=2)  # its own lag events do not keep it from idling out

    events = [e for e in read_all(kafka, topics.metrics, MetricEvent) if e.component == "lag"]
    assert events, "no lag event on the metrics topic"
    done = CliRunner().invoke(app, ["status", "-n", namespace, "--json"],
                              env={"UNDERTOW_BOOTSTRAP": kafka.bootstrap_servers})
    assert done.exit_code == 0, done.output
    status = json.loads(done.stdout)
    rollout = rollout_group(namespace)
    assert status["groups"][rollout]["lag"] == 9 and status["topic_lag"][topics.tasks] == 9
    last = events[-1].values
    assert last["group.rollout"] == status["groups"][rollout]["lag"]
    assert last["topic.tasks"] == status["topic_lag"][topics.tasks]
    # The same groups and topics: the monitor's own group on the metrics topic moves with every event it
    # publishes and reads, so its figure is the one not compared.
    assert {k for k in last if k.startswith("group.")} == {f"group.{short_name(g, namespace)}"
                                                          for g in status["groups"]}
    assert last["trainer_wait_fraction"] == 0.5
    written = {tag: value for tag, _, value in map(json.loads, (tmp_path / "points.jsonl").read_text().splitlines())}
    assert written["lag/group.rollout"] == 9 and written["lag/trainer_wait_fraction"] == 0.5
