"""track_topics keeps a Faust app's aiokafka producer from stranding queued records (a wedged worker)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from aiokafka import AIOKafkaProducer

from undertow.streams import KafkaSettings, Topics, create_topics
from undertow.streams.faust import track_topics

pytestmark = pytest.mark.broker


async def deliver_while_a_new_topic_appears(kafka: KafkaSettings, track: bool) -> bool:
    """Queue a record for a known topic, then send to a topic that does not exist yet."""
    ns = f"track-{uuid.uuid4().hex[:6]}"
    create_topics(kafka, ns)
    known, missing = Topics(ns).metrics, f"{ns}-not-declared-yet"
    producer = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap_servers, linger_ms=300)
    await producer.start()
    late = None
    try:
        await producer.client.force_metadata_update()  # tracks no topic yet, so this fetched all of them
        if track:
            await track_topics(producer, [known, missing])
        delivery = await producer.send(known, b"queued")  # lingers in the accumulator
        late = asyncio.create_task(producer.send(missing, b"first send to a new topic"))
        try:
            await asyncio.wait_for(delivery, 10)
            return True
        except asyncio.TimeoutError:
            return False
    finally:
        if late is not None:
            late.cancel()
        producer._sender._sender_task.cancel()  # stop() would wait for the stranded batch
        await producer.client.close()


def test_tracked_topics_keep_their_leaders_when_a_new_topic_appears(kafka):
    assert asyncio.run(deliver_while_a_new_topic_appears(kafka, track=True))


def test_untracked_the_queued_record_is_stranded(kafka):
    """The aiokafka behaviour track_topics exists for; if this starts failing, aiokafka fixed it."""
    assert not asyncio.run(deliver_while_a_new_topic_appears(kafka, track=False))
