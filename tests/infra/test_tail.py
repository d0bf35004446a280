"""`undertow tail`: each topic's records decoded (text, reward, advantage, version, rejection reasons),
undecodable bytes shown as such, --where, --json, the last lines of a partition, --follow."""

from __future__ import annotations

import json
import signal
import subprocess
import threading

import pytest

from undertow.infra.report.tail import Condition, tail
from undertow.schemas import MetricEvent, Rejected, encode
from undertow.streams import RecordProducer, Topics
from tests.helpers import cli, exp, produce, start_cli, wait_for

pytestmark = [pytest.mark.broker]


def ready(i: int):
    return exp(f"g{i}", 0, 1, reward=0.25 * i, text=f"answer {i}", tokens=2, version=i, advantages=[0.5 * i, 0.0])


def json_rows(*args: str) -> list[dict]:
    return [json.loads(line) for line in cli("tail", *args, "--json").stdout.splitlines()]


def test_experiences_print_their_text_reward_advantage_and_version(kafka, namespace):
    produce(kafka, Topics(namespace).ready, [ready(i) for i in range(4)])
    rows = sorted(json_rows("experiences.ready", "-n", namespace, "--from-beginning"), key=lambda r: r["experience_id"])
    assert [(r["kind"], r["policy_version"], r["reward"], r["advantage"], r["response_text"]) for r in rows] == [
        ("experience", i, 0.25 * i, 0.25 * i, f"answer {i}") for i in range(4)]
    assert rows[0]["prompt_text"] == "p" and rows[0]["key"] == "g0"
    chosen = json_rows("experiences.ready", "-n", namespace, "--from-beginning", "--where", "reward>=0.5",
                       "--where", "finish_reason=stop")
    assert sorted(r["experience_id"] for r in chosen) == ["g2/0", "g3/0"]


def test_undecodable_bytes_and_rejections_are_shown_not_a_crash(kafka, namespace):
    topics = Topics(namespace)
    with RecordProducer(kafka) as producer:
        producer.send_bytes(topics.raw, b"\xc1not msgpack at all", key="bad")
        producer.send(topics.raw, exp("g", 0, 1), key="g")
        producer.send(topics.rejected, Rejected.of("trainer", "stale", encode(exp("old", 0, 1)), detail="3 versions behind",
                                                  record_id="old/0"), key="old/0")
        producer.send(topics.rejected, Rejected.of("decode", "undecodable", b"\x00\x01", record_id=None), key="x")
    raw = {r["kind"]: r for r in tail(kafka, topics.raw, last=None, follow=False)}
    assert raw["undecodable"]["bytes"] == 19 and raw["undecodable"]["head"] == b"\xc1not msgpack at all".hex()
    assert raw["undecodable"]["reason"] == "undecodable" and raw["experience"]["experience_id"] == "g/0"
    rejected = list(tail(kafka, topics.rejected, last=None, follow=False))
    assert [(r["stage"], r["reason"], r["original_kind"]) for r in rejected] == [
        ("trainer", "stale", "experience"), ("decode", "undecodable", "undecodable (undecodable)")]
    text = cli("tail", "experiences.rejected", "-n", namespace).stdout
    assert 'stage="trainer" reason="stale" detail="3 versions behind" record_id="old/0"' in text
    raw_text = cli("tail", topics.raw).stdout  # a full topic name works too
    assert "undecodable" in raw_text and "g/0" in raw_text


def test_the_last_lines_and_follow(kafka, namespace):
    metrics = Topics(namespace).metrics
    produce(kafka, metrics, [MetricEvent(component="trainer", step=s, values={"loss": 1.0}) for s in range(5)],
            key_of=lambda e: e.component)
    assert [r["step"] for r in json_rows("metrics", "-n", namespace, "-l", "2")] == [3, 4]
    follower = start_cli("tail", "metrics", "-n", namespace, "--follow", "--lines", "1", "--json")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(follower.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for(lambda: lines, timeout=60, what="the last record", proc=follower)  # it is reading now
        for step in (7, 8):
            produce(kafka, metrics, [MetricEvent(component="trainer", step=step, values={"loss": 0.5})],
                    key_of=lambda e: e.component)
            wait_for(lambda: any(f'"step": {step}' in line for line in lines), timeout=60, what=f"step {step}",
                     proc=follower)
    finally:
        follower.send_signal(signal.SIGINT)
        assert follower.wait(30) == 0
    assert [json.loads(line)["step"] for line in lines if line.startswith("{")] == [4, 7, 8]


def test_a_bad_condition_is_a_clear_error():
    with pytest.raises(ValueError, match="expected FIELD OP VALUE"):
        Condition.parse("reward ~ 1")
    assert Condition.parse("reward>0.5").holds({"reward": 0.75}) and not Condition.parse("reward>0.5").holds({"reward": 0.5})
    assert Condition.parse("reason=stale").holds({"reason": "stale"}) and Condition.parse("x!=1").holds({})
