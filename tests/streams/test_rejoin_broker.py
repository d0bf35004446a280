"""kafka-python 3.0.12 forgot a leader's rejoin whose JoinGroup/SyncGroup outlasted a poll
(streams/kafka_fixes.py): the member kept no partitions. Here the broker answers SyncGroup late,
as a loaded host does, while the topic grows under the group."""

from __future__ import annotations

import uuid

import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka.admin import NewPartitions, NewTopic

from undertow.streams import connect
from undertow.streams.admin import admin_client
from tests.helpers import wait_for

pytestmark = pytest.mark.broker


def test_a_rejoin_for_new_partitions_that_outlasts_a_poll_still_assigns_them(kafka):
    topic = f"rejoin-{uuid.uuid4().hex[:6]}"
    with admin_client(kafka) as admin:
        admin.create_topics([NewTopic(topic, 1, 1)])
    consumer = connect(KafkaConsumer, kafka, group_id=topic, enable_auto_commit=False, metadata_max_age_ms=300)
    coordinator = consumer._coordinator
    state = lambda: {"assignment": sorted(p.partition for p in consumer.assignment()),  # noqa: E731
                     "member": coordinator.state, "join in flight": coordinator._join_task is not None,
                     "join done": getattr(coordinator._join_task, "is_done", None), "need_rejoin": coordinator.need_rejoin(),
                     "generation": coordinator._generation.generation_id}
    try:
        consumer.subscribe([topic])
        wait_for(lambda: consumer.poll(timeout_ms=50) is not None and consumer.assignment(), 60,
                 "the first assignment", state=state)

        manager, send = coordinator._manager, coordinator._manager.send

        async def later(*args, **kw):
            await manager._net.sleep(0.5)  # past the polls' 50 ms: the join task stays in flight between them
            return await send(*args, **kw)

        def late_sync(request, *args, **kw):  # the join task awaits what send gives; the others take its Future
            late = type(request).__name__.startswith("SyncGroupRequest")
            return (later if late else send)(request, *args, **kw)

        manager.send = late_sync
        with admin_client(kafka) as admin:
            admin.create_partitions({topic: NewPartitions(3)})
        grown = {TopicPartition(topic, p) for p in range(3)}
        wait_for(lambda: consumer.poll(timeout_ms=50) is not None and consumer.assignment() == grown, 60,
                 "the leader to rejoin and take the new partitions", state=state)
    finally:
        consumer.close()
