"""Faust apps bound to undertow's broker settings and record codec.

Topics are declared with the raw serializer and records are decoded by `RecordIO.decode`, not by a
Faust codec: a Faust codec that fails drops the message with a log line, whereas here a record that
fails validation goes to the rejected topic with its stage and reason.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Iterable

import faust
from aiokafka import AIOKafkaProducer

from undertow.schemas import DecodeError, Record, Rejected, decode, encode
from undertow.streams.producer import as_key
from undertow.streams.settings import KafkaSettings
from undertow.streams.topics import MAX_MESSAGE_BYTES, Topics


def create_app(app_id: str, settings: KafkaSettings, **overrides: Any) -> faust.App:
    """A Faust app on the configured cluster: acks=all, in-memory tables, no web server.

    `overrides` are Faust settings (e.g. `store="rocksdb://"`, `topic_partitions=8`).
    """
    kw: dict[str, Any] = dict(
        broker=settings.faust_broker(),
        broker_credentials=settings.faust_credentials(),
        value_serializer="raw",
        key_serializer="raw",
        store="memory://",
        web_enabled=False,
        producer_acks=-1,
        producer_max_request_size=MAX_MESSAGE_BYTES,
        consumer_max_fetch_size=32 << 20,
        consumer_auto_offset_reset="earliest",
        # A crashed worker's partitions move to the others after 10 s (Faust's default is 60 s).
        broker_session_timeout=10.0,
        broker_heartbeat_interval=3.0,
        # Our topics come from the catalog; Faust may still declare its own changelog topics.
        topic_allow_declare=True,
    )
    kw.update(overrides)
    # Tables live in memory, but Faust still makes a data directory (only its last level): not in
    # the caller's cwd.
    kw.setdefault("datadir", os.path.join(tempfile.gettempdir(), "undertow-faust", app_id))
    os.makedirs(os.path.dirname(kw["datadir"]), exist_ok=True)
    return faust.App(app_id, **kw)


async def track_topics(producer: AIOKafkaProducer, names: Iterable[str]) -> None:
    """Have a Faust app's producer track metadata for the topics it will write, before it writes.

    aiokafka's producer tracks no topic at first, and then refreshes metadata for all topics. Its
    first send to a topic it does not know yet (a table changelog Faust has not declared yet) makes
    it track that topic alone: records already queued for the other topics lose their partition
    leaders and wait for ever, while the sender spins on metadata requests. Seen as processor
    workers that wedged on fresh brokers. Naming every output topic first means tracking only grows.
    """
    await producer.client.set_topics(sorted(set(names)))


async def track_output_topics(app: faust.App, names: Iterable[str]) -> None:
    """`track_topics` for the app's own producer, started if it was not yet."""
    await track_topics(app.producer._ensure_producer(), names)  # Faust has no public handle on it


class RecordIO:
    """Record reading and writing for the agents of one Faust app.

    `decode` returns None for a message that is not a valid record of the expected kind, after
    sending it to the namespace's rejected topic; agents simply skip the None.
    """

    def __init__(self, app: faust.App, topics: Topics, stage: str):
        self.app, self.names, self.stage = app, topics, stage
        self._topics: dict[str, faust.TopicT] = {}
        self.rejected = 0

    def topic(self, name: str, **kw: Any) -> faust.TopicT:
        """A raw-bytes Faust topic (created once per name)."""
        if name not in self._topics:
            self._topics[name] = self.app.topic(name, key_type=bytes, value_type=bytes,
                                                key_serializer="raw", value_serializer="raw", **kw)
        return self._topics[name]

    async def decode(self, event: faust.EventT, expect: type[Record] | tuple[type[Record], ...]) -> Record | None:
        """The event's value as a validated record, or None once it has been dead-lettered."""
        m = event.message
        try:
            return decode(m.value or b"", expect=expect)
        except DecodeError as e:
            await self.reject(reason=e.reason, detail=e.detail, original=m.value or b"", key=m.key,
                              source_topic=m.topic, partition=m.partition, offset=m.offset, record_id=e.record_id)
            return None

    async def send(self, topic: str, record: Record, key: str | bytes | None = None) -> Any:
        """Encode and send a record; returns the delivery future (await it for the broker's ack)."""
        return await self.topic(topic).send(key=as_key(key), value=encode(record))

    async def reject(self, *, reason: str, detail: str = "", original: bytes = b"", key: bytes | None = None,
                     source_topic: str | None = None, partition: int | None = None, offset: int | None = None,
                     record_id: str | None = None, stage: str | None = None) -> Any:
        """Send a Rejected record for this stage to the rejected topic."""
        self.rejected += 1
        record = Rejected.of(stage or self.stage, reason, original, detail=detail, original_key=key, topic=source_topic,
                             partition=partition, offset=offset, record_id=record_id)
        return await self.send(self.names.rejected, record, key=record_id or key)
