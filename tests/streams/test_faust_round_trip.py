"""Records through a real Faust agent: the same codec on both sides, bad records dead-lettered."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from undertow.schemas import Rejected, record_types
from undertow.streams import RecordConsumer, RecordProducer, Topics
from tests.helpers import take
from tests.record_examples import make_examples

pytestmark = [pytest.mark.broker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_records_pass_through_a_faust_agent(kafka, namespace, tmp_path):
    topics = Topics(namespace)
    examples = make_examples()
    log = open(tmp_path / "faust.log", "w")
    worker = subprocess.Popen([sys.executable, "-m", "tests.streams.faust_relay", f"relay-{namespace}", namespace],
                              cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        with RecordProducer(kafka) as p:
            for kind, record in examples.items():
                p.send(topics.raw, record, key="same-group")
            p.send_bytes(topics.raw, b"\x00garbage", key="same-group")
            p.send(topics.raw, examples["task"], key="same-group")  # after the bad one: the stream went on
        with RecordConsumer(kafka, [topics.ready], group_id=None, expect=tuple(record_types().values()),
                            rejected_topic=topics.rejected) as c:
            got = take(c, len(examples) + 1, 90, "every record relayed", proc=worker)
        assert worker.poll() is None, (tmp_path / "faust.log").read_text()[-3000:]
        assert [d.record for d in got] == [*examples.values(), examples["task"]]
        assert {d.key for d in got} == {b"same-group"}
        with RecordConsumer(kafka, [topics.rejected], group_id=None, expect=Rejected,
                            rejected_topic=topics.rejected) as c:
            dead = take(c, 1, 30, "the garbage on the rejected topic", proc=worker)
        assert len(dead) == 1
        assert (dead[0].record.stage, dead[0].record.reason) == ("relay", "undecodable")
        assert dead[0].record.original == b"\x00garbage" and dead[0].record.topic == topics.raw
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(30)
        except subprocess.TimeoutExpired:
            worker.kill()
        log.close()
