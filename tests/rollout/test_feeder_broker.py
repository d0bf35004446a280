"""The feeder against the real broker: bounded lag (pull-based backpressure), difficulty selection, and a
restart that continues after its own tasks whatever else is on the topic."""

from __future__ import annotations

import threading

import pytest
from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition

from undertow.schemas import DecodeError, MetricEvent, Task, TaskStat, decode, encode
from undertow.streams import RecordProducer, Topics
from undertow.streams.consumer import read_to_end
from undertow.rollout.config import rollout_group
from undertow.rollout.feed_runner import Feeder
from undertow.rollout.feeder.sampler import draw_index
from tests.helpers import holds_for, load_run, read_all, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def commit_all(kafka, topic: str, group: str) -> None:
    """Act as the rollout group: commit past every task published so far."""
    consumer = KafkaConsumer(**kafka.kafka_python(), group_id=group, enable_auto_commit=False)
    parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
    consumer.commit({tp: OffsetAndMetadata(o, "", -1) for tp, o in consumer.end_offsets(parts).items()})
    consumer.close()


def test_feeder_keeps_the_lag_bounded(kafka, namespace, config_path):
    feeder_cfg = {"tasksets": [{"name": "arith", "source": {"name": "arithmetic", "size": 30}}],
                  "max_lag": 5, "group_size": 2, "poll_seconds": 0.1}
    cfg, context = load_run(config_path(feeder=feeder_cfg), kafka)
    feeder = Feeder(cfg.feeder, context)
    stop = threading.Event()
    thread = threading.Thread(target=feeder.run, kwargs={"max_tasks": 12, "stop": stop}, daemon=True)
    thread.start()
    topics = Topics(namespace)
    try:
        wait_for(lambda: feeder.stats.published == 5, what="5 tasks")
        holds_for(lambda: feeder.stats.published == 5, 1.5, "the feeder paused at max_lag")
        assert feeder.stats.pauses > 0
        commit_all(kafka, topics.tasks, rollout_group(namespace))      # workers took them
        wait_for(lambda: feeder.stats.published == 10, what="5 more")
        holds_for(lambda: feeder.stats.published == 10, 1.0, "the feeder paused at max_lag again")
        commit_all(kafka, topics.tasks, rollout_group(namespace))
        thread.join(timeout=30)
    finally:
        stop.set()
        thread.join(timeout=30)
    tasks = read_all(kafka, topics.tasks, Task)
    assert len(tasks) == 12 and len({t.task_id for t in tasks}) == 12
    assert {t.group_size for t in tasks} == {2} and all(t.answer for t in tasks)


def test_a_restarted_feeder_continues_after_what_it_published(kafka, namespace, config_path):
    """A resumed run must not draw a finite taskset again (nor reuse task and experience ids), and
    records another client put on the tasks topic must not move where it continues."""
    feeder_cfg = {"tasksets": [{"name": "arith", "source": {"name": "arithmetic", "size": 10}}],
                  "epochs": 1, "max_lag": 100, "poll_seconds": 0.1}
    cfg, context = load_run(config_path(feeder=feeder_cfg), kafka)
    topics = Topics(namespace)
    assert Feeder(cfg.feeder, context).run(max_tasks=4).published == 4
    put_foreign_records(kafka, topics.tasks)
    assert Feeder(cfg.feeder, context).run(max_tasks=3).published == 3
    put_foreign_records(kafka, topics.tasks)
    assert Feeder(cfg.feeder, context).run().published == 3  # the rest of the one epoch, then it stops
    assert Feeder(cfg.feeder, context).run().published == 0  # a finished taskset stays finished
    ours = [t.task_id for t in read_all_tasks(kafka, topics.tasks) if t.prompt != "foreign"]
    assert sorted(ours) == sorted(set(ours)) and len(ours) == 10, ours  # every task exactly once
    assert {draw_index(i) for i in ours} == set(range(10))


def put_foreign_records(kafka, topic: str) -> None:
    """What another producer might leave: junk bytes, other kinds, tasks in our id form that are not ours."""
    with RecordProducer(kafka) as producer:
        for junk in (b"garbage", b"\x81\xa4kind\xa4task", encode(TaskStat(task_id="arith/0@0", taskset="arith"))):
            producer.send_bytes(topic, junk, key="junk")
        for task_id in ("arith/1@9", "arith/2@5000", "other/0@3"):
            producer.send(topic, Task(task_id=task_id, prompt="foreign", taskset=task_id.split("/")[0]), key=task_id)


def read_all_tasks(kafka, topic: str) -> list[Task]:
    """The records of `topic` that decode as tasks (the junk is skipped)."""
    out = []
    for value in read_to_end(kafka, topic):
        try:
            out.append(decode(value, expect=Task))
        except DecodeError:
            pass
    return out


def test_feeder_mixes_by_ratio_and_favours_medium_tasks_from_task_stats(kafka, namespace, config_path):
    topics = Topics(namespace)
    with RecordProducer(kafka) as producer:
        for task_id, attempts, successes in [("hard/0@0", 8, 0), ("hard/1@1", 8, 8), ("hard/2@2", 8, 4)]:
            producer.send(topics.task_stats, TaskStat(task_id=task_id, taskset="hard", attempts=attempts,
                                                      successes=successes), key=task_id)
        producer.send_bytes(topics.task_stats, b"garbage", key="x")  # dead-lettered, feeding goes on
    feeder_cfg = {"tasksets": [{"name": "hard", "source": {"name": "arithmetic", "size": 3}, "ratio": 3},
                               {"name": "count", "source": {"name": "countdown", "size": 50}, "ratio": 1}],
                  "epochs": None, "max_lag": 1000, "selector": {"name": "difficulty", "min_attempts": 4}}
    cfg, context = load_run(config_path(feeder=feeder_cfg), kafka)
    feeder = Feeder(cfg.feeder, context)
    assert feeder.run(max_tasks=200).published == 200
    assert feeder.stats.stats_read == 3
    tasks = read_all(kafka, topics.tasks, Task)
    hard = [t for t in tasks if t.taskset == "hard"]
    assert len(hard) == 150 and len(tasks) - len(hard) == 50  # 3 : 1
    # Weights 0.05 (never), 0.05 (always), 1 (half): the medium item gets ~1/1.1 of the hard draws.
    assert sum(t.metadata["item"] == "2" for t in hard) / len(hard) == pytest.approx(1 / 1.1, abs=0.07)
    assert any(r.stage == "feeder" for r in read_all(kafka, topics.rejected))
    # The curriculum's pass rates on the metrics topic: hard's items 0/8, 8/8, 4/8 -> 12/24.
    last = [m for m in read_all(kafka, topics.metrics, MetricEvent) if m.component == "feeder"][-1]
    assert last.values == {"hard/pass_rate": 0.5} and last.step == 200
