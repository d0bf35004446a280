"""`undertow status` numbers from a real broker, and `undertow report` from a metrics log."""

from __future__ import annotations

import json

import pytest
from kafka import TopicPartition

from undertow.infra.report.writer import collect, write_report
from undertow.infra.report.namespace import namespace_status
from undertow.schemas import Task, chunk_weights
from undertow.streams import RecordConsumer, RecordProducer, Topics


@pytest.mark.broker
def test_status_counts_records_lag_and_latest_version(kafka, namespace):
    topics = Topics(namespace)
    with RecordProducer(kafka) as p:
        for i in range(10):
            p.send(topics.tasks, Task(task_id=f"t{i}", prompt="1+1"), partition=0)
        for version in (1, 2, 3):
            for chunk in chunk_weights("policy", version, bytes(range(50)), 20):
                p.send(topics.weights, chunk, key="policy")
    with RecordConsumer(kafka, [topics.tasks], group_id=f"{namespace}-workers", expect=Task,
                        rejected_topic=topics.rejected) as c:
        got = []
        while len(got) < 10:
            got += c.poll(timeout_ms=500)
        c.commit({TopicPartition(topics.tasks, 0): 4})
    status = namespace_status(kafka, namespace)
    assert status.records[topics.tasks] == 10 and status.records[topics.weights] == 9
    lag = next(g for g in status.groups if g.group == f"{namespace}-workers")
    assert (lag.topic, lag.committed, lag.end, lag.lag) == (topics.tasks, 4, 10, 6)
    assert status.policy_version == 3


def test_report_plots_each_panel_and_summarises(tmp_path):
    rows = [{"component": "trainer", "step": s, "time": 100.0 + s, "loss": 1.0 / (s + 1), "kl": 0.01 * s,
             "tokens_per_s": 500.0} for s in range(10)]
    rows += [{"stage": "rl", "component": "processor", "step": None, "time": 100.0 + s, "reward_mean": 0.1 * s,
              "staleness_mean": 1.0} for s in range(10)]
    rows += [{"stage": "rl", "component": "eval", "step": v, "version": v, "time": 100.0 + v,
              "sums/greedy_accuracy": 0.1 * v, "sums/pass@4": 0.2, "clip_fraction": 0.0} for v in (0, 5)]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    panels = collect(rows)
    assert {s.name for s in panels["loss"]} == {"loss", "kl", "clip_fraction"}
    (accuracy, _) = panels["evaluation"]
    assert accuracy.name == "sums/greedy_accuracy" and accuracy.versions == [0, 5] and accuracy.values == [0.0, 0.5]
    assert [s.name for s in panels["reward"]] == ["reward_mean"]
    assert [s.name for s in panels["throughput"]] == ["tokens_per_s"]
    summary = write_report(tmp_path).read_text()
    assert "| rl/processor:reward_mean | 10 | 0 | 0.9 |" in summary  # stage-labelled; first/last tenth
    for panel in ("reward", "staleness", "throughput", "loss", "evaluation", "evaluation-by-version"):
        assert (tmp_path / "report" / f"{panel}.png").stat().st_size > 1000


def test_report_without_metrics_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no metrics"):
        write_report(tmp_path)


@pytest.mark.broker
def test_status_json_gives_lag_per_group_and_topic(kafka, namespace):
    """The autoscaler's input: a group that committed 4 of partition 0's 10 tasks and nothing of
    partition 1's 5 has 6 + 5 = 11 to do (a partition it never committed counts from its beginning)."""
    from typer.testing import CliRunner

    from undertow.infra.cli import app

    topics = Topics(namespace)
    with RecordProducer(kafka) as p:
        for i in range(15):
            p.send(topics.tasks, Task(task_id=f"t{i}", prompt="1+1"), partition=0 if i < 10 else 1)
    with RecordConsumer(kafka, [], group_id=f"{namespace}.rollout", expect=Task) as c:
        c.assign(topics.tasks, "earliest")
        c.commit({TopicPartition(topics.tasks, 0): 4})
    out = CliRunner().invoke(app, ["status", "--namespace", namespace, "--json"])
    assert out.exit_code == 0, out.output
    signal = json.loads(out.stdout)
    group = signal["groups"][f"{namespace}.rollout"]
    assert group["lag"] == 11 and group["topics"][topics.tasks] == {"lag": 11, "committed": 4, "end": 15}
    assert signal["topic_lag"] == {topics.tasks: 11} and signal["records"][topics.tasks] == 15
