"""Partition counts from config, and partitions added to a live namespace, against the real broker."""

from __future__ import annotations

import uuid

import pytest
from kafka.admin import NewTopic
from kafka.partitioner.default import murmur2

from undertow.schemas import Experience, Task
from undertow.streams import RecordConsumer, RecordProducer, Topics, create_topics, describe_topics, grow_topics
from undertow.streams.admin import admin_client
from tests.helpers import cli, exp, wait_for

pytestmark = pytest.mark.broker


def partition(key: str, n: int) -> int:
    """Where the default partitioner puts `key` among `n` partitions (kafka-python's and Java's murmur2)."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % n


def key_on(n: int, wanted: int, prefix: str) -> str:
    return next(f"{prefix}{i}" for i in range(1000) if partition(f"{prefix}{i}", n) == wanted)


def test_partitions_from_config_then_grown_under_a_live_group(kafka):
    ns = f"grow-{uuid.uuid4().hex[:6]}"
    topics = Topics(ns)
    create_topics(kafka, ns, partitions={"tasks": 2, "experiences.raw": 2})
    changelog, other = f"{ns}-processors-groups-changelog", f"{ns}-processors-__assignor-__leader"
    with admin_client(kafka) as admin:  # what the processors' Faust app keeps beside experiences.raw
        admin.create_topics([NewTopic(changelog, 2, 1), NewTopic(other, 1, 1)])
    parts = lambda *names: [i.partitions for i in describe_topics(kafka, list(names))]  # noqa: E731
    assert parts(topics.tasks, topics.raw, topics.ready) == [2, 2, 4]  # configured, configured, catalog's

    # A rollout-style member of the tasks group, reading while the topic grows.
    got: list[str] = []
    consumer = RecordConsumer(kafka, [topics.tasks], group_id=f"{ns}.rollout", expect=Task, metadata_max_age_ms=1000)
    # An open prompt group: half its samples published before the growth, by a producer that keeps running.
    group_id = next(g for g in (f"g{i}" for i in range(1000)) if partition(g, 2) != partition(g, 4))
    producer = RecordProducer(kafka)
    try:
        producer.send(topics.tasks, Task(task_id="before", prompt="p"), key=key_on(2, 0, "t"))
        for i in (0, 1):
            producer.send(topics.raw, exp(group_id, i, size=4), key=group_id)
        producer.flush()
        wait_for(lambda: got.extend(d.record.task_id for d in consumer.poll(200)) or "before" in got, 30, "first task")

        grown = grow_topics(kafka, ns, {"tasks": 4, "experiences.raw": 4, "experiences.ready": 3})
        # ready asked 3 but has 4: Kafka never removes partitions, so it is left alone; the changelog grows with raw
        assert sorted((g.topic, g.before, g.after) for g in grown) == sorted(
            [(topics.tasks, 2, 4), (topics.raw, 2, 4), (changelog, 2, 4)])
        assert parts(topics.tasks, topics.raw, changelog, other) == [4, 4, 4, 1]
        assert grow_topics(kafka, ns, {"tasks": 4}) == []  # a second call finds nothing to add

        # The member takes the new partitions at its next metadata refresh: a task on partition 3 reaches it.
        with RecordProducer(kafka) as late:
            late.send(topics.tasks, Task(task_id="after", prompt="p"), key=key_on(4, 3, "t"))
            for i in (2, 3):  # the open group's other half, from a producer that sees 4 partitions
                late.send(topics.raw, exp(group_id, i, size=4), key=group_id)
        held = lambda: {"got": got, "assigned": sorted(tp.partition for tp in consumer._consumer.assignment()),  # noqa: E731
                        "partitions": parts(topics.tasks)}
        wait_for(lambda: got.extend(d.record.task_id for d in consumer.poll(200)) or "after" in got, 90,
                 "the member to take the new partition and read its task", state=held)
        assert sorted(got) == ["after", "before"]
    finally:
        consumer.close()
        producer.close()

    # The open group is split: its first half stays on murmur2 % 2, the rest goes to murmur2 % 4. Nothing
    # is lost (a reader of every partition, like the trainer, has all 4 samples), but two processor
    # workers may hold the halves: each closes its half at processors.group_timeout_s (README, "Scaling out").
    with RecordConsumer(kafka, [], group_id=None, expect=Experience) as reader:
        reader.assign(topics.raw, "earliest")
        seen = {}
        wait_for(lambda: seen.update({d.record.sample_index: d.partition for d in reader.poll(200)}) or len(seen) == 4,
                 30, "the group's samples")
    assert seen == {0: partition(group_id, 2), 1: partition(group_id, 2), 2: partition(group_id, 4),
                    3: partition(group_id, 4)}


def test_topics_create_partitions_grows_the_scaled_topics(kafka, tmp_path):
    """`undertow topics create --partitions N`: tasks, raw and ready to N; the config's count for the rest."""
    ns = f"grow-cli-{uuid.uuid4().hex[:6]}"
    config = tmp_path / "run.yaml"
    config.write_text(f"namespace: {ns}\ntopics:\n  partitions: {{evals: 2}}\n")
    create_topics(kafka, ns)
    out = cli("topics", "create", "--config", str(config), "--partitions", "6").stdout
    topics = Topics(ns)
    assert [line.strip() for line in out.splitlines()[1:]] == [
        f"{ns}.evals: 1 -> 2 partitions", f"{ns}.experiences.raw: 4 -> 6 partitions",
        f"{ns}.experiences.ready: 4 -> 6 partitions", f"{ns}.tasks: 4 -> 6 partitions"]
    assert [i.partitions for i in describe_topics(kafka, [topics.tasks, topics.evals, topics.weights])] == [6, 2, 1]
