"""A stage's drain, read through the real broker: it is settled only while the rollout group has
committed every task and the processors every raw record (infra/run/drain.py)."""

from __future__ import annotations

import time

import pytest

from undertow.infra.run.drain import Drain
from undertow.processors.config import processors_group
from undertow.rollout.config import rollout_group
from undertow.schemas import Task
from undertow.streams import RecordConsumer, Topics
from tests.helpers import exp, produce, take, wait_for

pytestmark = pytest.mark.broker


def commit_all(kafka, topic: str, group: str, want: int) -> None:
    with RecordConsumer(kafka, [topic], group_id=group, expect=None, rejected_topic=topic + ".unused") as consumer:
        assert len(take(consumer, want, 60, f"{want} records on {topic}")) == want
        consumer.commit()


def test_the_drain_settles_once_both_groups_committed_everything_and_unsettles_on_new_work(kafka, namespace):
    topics = Topics(namespace)
    rollout, processors = rollout_group(namespace), processors_group(namespace)
    produce(kafka, topics.tasks, [Task(task_id=f"t{i}", prompt="1+1=") for i in range(3)], key_of=lambda t: t.task_id)
    produce(kafka, topics.raw, [exp("g", i, 2) for i in range(2)])
    drain = Drain(kafka, [(topics.tasks, rollout), (topics.raw, processors)], every_s=0.2).start()
    try:
        wait_for(lambda: drain.lags == {rollout: 3, processors: 2}, what=f"the lags (read: {drain.lags})")
        assert drain.settled_since is None
        commit_all(kafka, topics.tasks, rollout, 3)
        wait_for(lambda: drain.lags == {rollout: 0, processors: 2}, what="the rollout group's commit")
        assert drain.settled_since is None  # the processors have yet to do theirs
        before = time.time()
        commit_all(kafka, topics.raw, processors, 2)
        wait_for(lambda: drain.settled_since is not None, what="the drain to settle")
        assert drain.settled_since >= before - 1
        produce(kafka, topics.tasks, [Task(task_id="t9", prompt="2+2=")], key_of=lambda t: t.task_id)
        wait_for(lambda: drain.settled_since is None, what="a new task to unsettle it")
    finally:
        drain.stop()
