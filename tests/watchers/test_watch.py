"""`undertow watch` against the broker: alerts land on the metrics topic; a watcher that raises has
its error recorded and goes on after the record that broke it; a restart resumes from each
watcher's committed offsets, alerting on nothing twice."""

from __future__ import annotations

import signal

import pytest

from undertow.schemas import MetricEvent
from undertow.streams import GroupLag, Topics
from tests.helpers import exp, produce, read_all, start_cli, wait_for, write_config

pytestmark = [pytest.mark.broker]
USERS = "tests.watchers.plugins.too_long"  # named by dotted path: that is its name, and its group's


def watcher_events(kafka, topics: Topics) -> list[MetricEvent]:
    return [e for e in read_all(kafka, topics.metrics, MetricEvent) if e.component == "watcher"]


def alerts(events: list[MetricEvent], name: str) -> list[MetricEvent]:
    return [e for e in events if e.labels.get("alert") == name]


def errors(events: list[MetricEvent]) -> list[MetricEvent]:
    return [e for e in events if "error" in e.labels]


def stop(proc) -> str:
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, output[-5000:]
    return output


def test_watch_alerts_records_a_raising_watcher_and_resumes(kafka, namespace, tmp_path):
    topics = Topics(namespace)
    config = write_config(tmp_path / "run.yaml", namespace, watchers=[
        {"name": "response_length", "window": 2, "baseline": 2, "factor": 2.0},
        {"name": USERS, "max_tokens": 8, "raise_on": "boom"}])
    one_partition = lambda r: "g"  # noqa: E731 — the baseline is the first two records, in order
    produce(kafka, topics.raw, [exp("a", tokens=3), exp("b", tokens=3), exp("c", text="boom"),
                                exp("d", tokens=20), exp("e", tokens=20)], key_of=one_partition)

    proc = start_cli("watch", str(config))
    def all_landed() -> list[MetricEvent] | None:
        es = watcher_events(kafka, topics)
        done = len(alerts(es, "too_long")) >= 2 and alerts(es, "response_length_blowup") and errors(es)
        return es if done else None

    events = wait_for(all_landed, timeout=90, what="alerts and the error on the metrics topic", proc=proc)
    (blowup,) = alerts(events, "response_length_blowup")
    assert blowup.labels["watcher"] == "response_length" and blowup.values["threshold"] == 6.0
    assert blowup.values["response_tokens_mean"] == 11.5  # (3 + 20) / 2: "boom" had 3 tokens
    (error,) = errors(events)
    assert error.labels["watcher"] == USERS and "RuntimeError: cannot judge c/0" in error.labels["error"]
    assert [e.values["response_tokens"] for e in alerts(events, "too_long")] == [20.0, 20.0]  # it went on
    wait_for(lambda: GroupLag(kafka, topics.raw, f"{namespace}.watcher.{USERS}")() == 0,
             what="too_long's offsets committed")
    output = stop(proc)
    assert f"watcher {USERS}: 5 records, 2 alerts, 1 errors" in output, output[-3000:]

    proc = start_cli("watch", str(config))  # from the committed offsets: nothing already seen again
    produce(kafka, topics.raw, [exp("f", tokens=30)], key_of=one_partition)
    wait_for(lambda: len(alerts(watcher_events(kafka, topics), "too_long")) >= 3, timeout=90,
             what="an alert on the new record", proc=proc)
    stop(proc)
    events = watcher_events(kafka, topics)
    assert [e.values["response_tokens"] for e in alerts(events, "too_long")] == [20.0, 20.0, 30.0]
    assert len(alerts(events, "response_length_blowup")) == 1 and len(errors(events)) == 1
