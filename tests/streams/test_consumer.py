"""RecordConsumer's positioning API on the real broker: where `assign` starts each partition (of one
topic or several), end offsets, positions, pause / resume / idle, one error for a topic that does
not exist, and `read_messages`, the undecoded read of a topic up to its end."""

from __future__ import annotations

import time

import pytest

from undertow.schemas import DecodeError, MetricEvent
from undertow.streams import GroupLag, KafkaSettings, RecordConsumer, RecordProducer, TopicNotFound, Topics
from undertow.streams.consumer import read_messages
from tests.helpers import take, wait_for

pytestmark = pytest.mark.broker


def metric(i: int) -> MetricEvent:
    return MetricEvent(component="test", values={"i": float(i)}, step=i)


def fill(kafka: KafkaSettings, topic: str, per_partition: dict[int, int]) -> None:
    """`n` metrics on each partition, numbered from 0 in each."""
    with RecordProducer(kafka) as producer:
        for partition, n in per_partition.items():
            for i in range(n):
                producer.send(topic, metric(i), key=f"m{i}", partition=partition)  # compacted topics need keys


def consumer(kafka: KafkaSettings, ns: str, group: str | None = None) -> RecordConsumer[MetricEvent]:
    return RecordConsumer(kafka, [], group_id=group, expect=MetricEvent, rejected_topic=Topics(ns).rejected)


def read(c: RecordConsumer, want: int, timeout_s: float = 20.0) -> list[tuple[int, int]]:
    """(partition, offset) of the next `want` records, sorted."""
    return sorted((d.partition, d.offset) for d in take(c, want, timeout_s, f"{want} records"))


def test_assign_starts_each_partition_where_asked(kafka, namespace):
    topic = Topics(namespace).ready  # 4 partitions
    fill(kafka, topic, {0: 3, 1: 2})
    parts = {(topic, p) for p in range(4)}
    with consumer(kafka, namespace) as c:
        assert c.assign(topic, "earliest") == {(topic, 0): 0, (topic, 1): 0, (topic, 2): 0, (topic, 3): 0}
        assert read(c, 5) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]
        assert c.end_offsets() == {(topic, 0): 3, (topic, 1): 2, (topic, 2): 0, (topic, 3): 0}
        assert set(c.assign(topic, "latest").items()) == {((topic, 0), 3), ((topic, 1), 2), ((topic, 2), 0),
                                                          ((topic, 3), 0)}
        assert c.poll(timeout_ms=500) == []
        starts = c.assign(topic, {(topic, 0): 2})  # partition 0 named; the others: committed, else first
        assert starts == {(topic, 0): 2, (topic, 1): 0, (topic, 2): 0, (topic, 3): 0} and set(starts) == parts
        assert read(c, 3) == [(0, 2), (1, 0), (1, 1)]


def test_committed_start_continues_after_the_group_commit(kafka, namespace):
    topic = Topics(namespace).ready
    fill(kafka, topic, {0: 4, 2: 2})
    with consumer(kafka, namespace, group="g") as c:
        c.assign(topic, "committed")  # nothing committed yet: the first record
        assert read(c, 6) == [(0, 0), (0, 1), (0, 2), (0, 3), (2, 0), (2, 1)]
        c.commit({(topic, 0): 3, (topic, 2): 1})  # (topic, partition) tuples, no kafka types
    with consumer(kafka, namespace, group="g") as c:
        assert c.assign(topic)[(topic, 0)] == 3
        assert read(c, 2) == [(0, 3), (2, 1)]
        explicit = c.assign(topic, {(topic, 2): 0})  # explicit wins over committed
        assert explicit[(topic, 2)] == 0 and explicit[(topic, 0)] == 3


def test_reached_says_when_the_end_of_start_was_read(kafka, namespace):
    topic = Topics(namespace).weights  # 1 partition
    fill(kafka, topic, {0: 3})
    with consumer(kafka, namespace) as c:
        c.assign(topic, "earliest")
        end = c.end_offsets()
        assert not c.reached(end)
        read(c, 3)
        assert c.reached(end)


def test_paused_partitions_deliver_nothing_until_resumed(kafka, namespace):
    topic = Topics(namespace).weights
    fill(kafka, topic, {0: 2})
    with consumer(kafka, namespace) as c:
        c.assign(topic, "earliest")
        c.pause()
        assert c.poll(timeout_ms=1000) == []
        c.resume()
        assert read(c, 2) == [(0, 0), (0, 1)]
        c.assign(topic, "earliest")
        started = time.monotonic()
        c.idle(0.5)  # waits, takes nothing, and the records are still there after it
        assert time.monotonic() - started >= 0.4
        assert read(c, 2) == [(0, 0), (0, 1)]


def test_a_missing_topic_is_one_error_that_says_how_to_make_it(kafka, namespace):
    missing = f"{namespace}.nowhere"
    with consumer(kafka, namespace) as c, pytest.raises(TopicNotFound, match="undertow topics create"):
        c.assign(missing)
    with pytest.raises(TopicNotFound):
        GroupLag(kafka, missing, "g")


def test_group_lag_counts_what_the_group_has_not_committed(kafka, namespace):
    topic = Topics(namespace).tasks
    fill(kafka, topic, {0: 3, 3: 2})
    lag = GroupLag(kafka, topic, "workers")
    try:
        assert lag() == 5
        with consumer(kafka, namespace, group="workers") as c:
            c.commit({(topic, 0): 2})
        assert lag() == 3
    finally:
        lag.close()


def test_idle_through_a_rebalance_loses_nothing(kafka, namespace):
    """A group member idling as it joins: its new partitions are not paused, and what they deliver
    during the idle must be read again afterwards, not skipped."""
    topic = Topics(namespace).tasks
    fill(kafka, topic, {0: 2, 1: 1})
    c = RecordConsumer(kafka, [topic], group_id="idler", expect=MetricEvent, rejected_topic=Topics(namespace).rejected)
    with c:
        wait_for(lambda: c.idle(0.5) or c.end_offsets(), 20, "the group assigning the idler its partitions", every=0)
        c.idle(2.0)  # assigned and fetching by now
        assert read(c, 3) == [(0, 0), (0, 1), (1, 0)]


def test_a_commit_refused_for_a_rebalance_rejoins_and_commits(kafka, namespace, monkeypatch):
    """kafka-python refuses a commit itself (RebalanceInProgressError) while its member is rejoining:
    a worker that polled to stay alive during a long batch (rollout/worker.py) can be midway through a
    rejoin when the batch ends. That error once killed a worker thread in the elastic rollout test,
    and its batch was generated twice. Here the client's refusal comes on the first try, as it does
    then; the commit must rejoin (taking no record) and land on the real broker."""
    from kafka.errors import RebalanceInProgressError

    topic = Topics(namespace).tasks
    fill(kafka, topic, {0: 3, 1: 3})
    group = f"{namespace}-rebalance"
    first = RecordConsumer(kafka, [topic], group_id=group, expect=MetricEvent, rejected_topic=Topics(namespace).rejected)
    with first:
        assert read(first, 6) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
        real, tries = first._consumer.commit, []

        def refused_once(*args, **kwargs):
            tries.append(args)
            if len(tries) == 1:
                raise RebalanceInProgressError("the consumer is undergoing a rebalance")
            return real(*args, **kwargs)

        monkeypatch.setattr(first._consumer, "commit", refused_once)
        first.commit({(topic, p): 3 for p in (0, 1)})
        assert len(tries) == 2 and first.poll(timeout_ms=500) == []  # committed; nothing read again
    assert committed_offsets(kafka, group, topic) == {0: 3, 1: 3}


def committed_offsets(kafka: KafkaSettings, group: str, topic: str) -> dict[int, int]:
    from kafka import KafkaConsumer, TopicPartition

    reader = KafkaConsumer(**kafka.kafka_python(), group_id=group, enable_auto_commit=False)
    try:
        return {p: reader.committed(TopicPartition(topic, p)) for p in (0, 1)}
    finally:
        reader.close()


def test_assign_takes_several_topics_and_pauses_one_partition(kafka, namespace):
    topics = Topics(namespace)
    fill(kafka, topics.weights, {0: 3})
    fill(kafka, topics.ready, {0: 2})
    with consumer(kafka, namespace) as c:
        starts = c.assign([topics.weights, topics.ready], {(topics.weights, 0): 1})  # 1 + 4 partitions
        assert starts == {(topics.weights, 0): 1, **{(topics.ready, p): 0 for p in range(4)}}
        assert read(c, 4) == [(0, 0), (0, 1), (0, 1), (0, 2)]  # weights 1, 2 and ready 0, 1
        assert c.positions() == {(topics.weights, 0): 3, (topics.ready, 0): 2, (topics.ready, 1): 0,
                                 (topics.ready, 2): 0, (topics.ready, 3): 0}
        c.pause([(topics.ready, 0)])  # only that one: weights still flows
        fill(kafka, topics.weights, {0: 1})
        fill(kafka, topics.ready, {0: 1})
        assert [(d.topic, d.offset) for d in c.poll(timeout_ms=2000)] == [(topics.weights, 3)]
        assert c.poll(timeout_ms=1000) == []
        c.resume([(topics.ready, 0)])
        assert [(d.topic, d.offset) for d in c.poll(timeout_ms=5000)] == [(topics.ready, 2)]


def test_read_messages_takes_the_last_of_each_partition_undecoded(kafka, namespace):
    topic = Topics(namespace).weights
    fill(kafka, topic, {0: 4})
    with RecordProducer(kafka) as producer:
        producer.send_bytes(topic, b"not a record", key="bad")
    assert [m.offset for m in read_messages(kafka, topic)] == [0, 1, 2, 3, 4]
    assert [(m.offset, m.value) for m in read_messages(kafka, topic, last=2)][1] == (4, b"not a record")
    assert [m.offset for m in read_messages(kafka, topic, last=2)] == [3, 4]
    # A reader without a rejected topic opens no producer; a record that does not decode raises.
    with RecordConsumer(kafka, [], group_id=None, expect=MetricEvent) as c:
        c.assign(topic, {(topic, 0): 4})
        with pytest.raises(DecodeError):
            read(c, 1)
        assert c._producer is None
