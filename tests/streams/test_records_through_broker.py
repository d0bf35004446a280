"""Every record type through the real broker; bad bytes end in the rejected topic, nothing stops."""

from __future__ import annotations

import msgpack
import pytest
from kafka import TopicPartition

from undertow.schemas import Experience, Record, Rejected, decode, encode, record_types
from undertow.streams import KafkaSettings, RecordConsumer, RecordProducer, Topics
from tests.helpers import take
from tests.record_examples import make_examples

pytestmark = pytest.mark.broker
ALL_KINDS = tuple(record_types().values())


def rejected_records(kafka: KafkaSettings, ns: str, want: int) -> list[Rejected]:
    with RecordConsumer(kafka, [Topics(ns).rejected], group_id=None, expect=Rejected,
                        rejected_topic=Topics(ns).rejected) as c:
        return [d.record for d in take(c, want, 30)]


def test_every_record_type_round_trips(kafka, namespace):
    topic = Topics(namespace).raw
    examples = make_examples()
    assert set(examples) == set(record_types())  # a new record type must be added to the examples
    with RecordProducer(kafka) as p:
        for kind, record in examples.items():
            p.send(topic, record, key=kind, partition=0).get(timeout=30)
    with RecordConsumer(kafka, [topic], group_id="rt", expect=ALL_KINDS, rejected_topic=Topics(namespace).rejected) as c:
        got = take(c, len(examples), 30)
    assert [d.record for d in got] == list(examples.values())
    assert [d.key for d in got] == [k.encode() for k in examples]
    assert [d.offset for d in got] == list(range(len(examples)))


def _bad_payloads() -> dict[str, bytes]:
    good = make_examples()["experience"]
    fields = msgpack.unpackb(encode(good), raw=False)
    return {
        "undecodable": b"\xff\x00 not msgpack",
        "schema_too_new": msgpack.packb({**fields, "schema_version": 99}),
        "invalid": msgpack.packb({**fields, "reward": float("nan")}),
        "unexpected_kind": encode(make_examples()["task"]),
    }


def test_bad_messages_are_dead_lettered_and_consumption_goes_on(kafka, namespace):
    topics = Topics(namespace)
    good = make_examples()["experience"]
    bad = _bad_payloads()
    with RecordProducer(kafka) as p:
        p.send(topics.raw, good.model_copy(update={"experience_id": "before"}), partition=0)
        for reason, payload in bad.items():
            p.send_bytes(topics.raw, payload, key=reason, partition=0)
        p.send(topics.raw, good.model_copy(update={"experience_id": "after"}), partition=0)
    with RecordConsumer(kafka, [topics.raw], group_id="dl", expect=Experience, rejected_topic=topics.rejected) as c:
        got = take(c, 2, 30)
        c.commit()
        assert c.rejected == len(bad)
    assert [d.record.experience_id for d in got] == ["before", "after"]

    dead = rejected_records(kafka, namespace, len(bad))
    assert [r.reason for r in dead] == list(bad)
    assert [r.original for r in dead] == list(bad.values())  # the original bytes, untouched
    assert all(r.stage == "decode" and r.topic == topics.raw and r.partition == 0 for r in dead)
    assert [r.offset for r in dead] == [1, 2, 3, 4]
    nan = dead[2]
    assert "reward" in nan.detail and nan.record_id == good.experience_id


def test_uncommitted_records_are_delivered_again(kafka, namespace):
    """As the trainer reads: partitions assigned, from the group's committed offsets. (It subscribed
    before, and so waited on the group's rebalance too: once, under load, nothing came in 30 s.)"""
    topic = Topics(namespace).ready
    exps = [make_examples()["experience"].model_copy(update={"experience_id": f"e{i}"}) for i in range(6)]
    with RecordProducer(kafka) as p:
        for e in exps:
            p.send(topic, e, partition=0)
    kw = dict(group_id=f"{namespace}.trainer", expect=Experience, rejected_topic=Topics(namespace).rejected)
    with RecordConsumer(kafka, [], **kw) as c:
        c.assign(topic, "committed")
        first = take(c, 6, 30)
        c.commit({TopicPartition(topic, 0): 3})  # only the first three were "trained on"
    with RecordConsumer(kafka, [], **kw) as c:
        assert c.assign(topic, "committed")[(topic, 0)] == 3
        again = take(c, 3, 30)
    assert [d.record.experience_id for d in first] == [f"e{i}" for i in range(6)]
    assert [d.record.experience_id for d in again] == ["e3", "e4", "e5"]


def test_a_record_decoded_from_the_topic_equals_what_was_sent(kafka, namespace):
    # The codec is the same on both sides: what kafka-python stored is exactly encode(record).
    from kafka import KafkaConsumer

    record: Record = make_examples()["task"]
    with RecordProducer(kafka) as p:
        p.send(Topics(namespace).tasks, record, key=record.task_id, partition=1).get(timeout=30)
    c = KafkaConsumer(**kafka.kafka_python(), auto_offset_reset="earliest", consumer_timeout_ms=10000)
    c.assign([TopicPartition(Topics(namespace).tasks, 1)])
    message = next(iter(c))
    c.close()
    assert message.value == encode(record) and decode(message.value) == record


def test_flush_raises_when_the_broker_refused_a_record(kafka, namespace):
    """A refused send must stop the caller before it commits the offsets the record covered."""
    from kafka.admin import KafkaAdminClient, NewTopic

    from undertow.streams import DeliveryError, connect

    topic = f"{namespace}.tiny-messages"
    admin = connect(KafkaAdminClient, kafka)
    admin.create_topics([NewTopic(topic, 1, 1, topic_configs={"max.message.bytes": "2048"})])
    admin.close()
    producer = RecordProducer(kafka)
    producer.send_bytes(topic, b"x" * 100)
    producer.flush()  # accepted: no error
    producer.send_bytes(topic, b"x" * 100_000)
    with pytest.raises(DeliveryError, match="1 record"):
        producer.flush()
    producer.close()
