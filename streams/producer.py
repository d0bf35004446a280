"""Publishing records: idempotent, acks=all, encoded with the record codec."""

from __future__ import annotations

import logging
import time
from typing import Any

from kafka import KafkaProducer
from kafka.errors import KafkaTimeoutError
from kafka.producer.future import FutureRecordMetadata

from undertow.schemas import MAX_RECORD_BYTES, Record, Rejected, encode
from undertow.streams.connect import connect
from undertow.streams.settings import KafkaSettings
from undertow.streams.topics import MAX_MESSAGE_BYTES


log = logging.getLogger(__name__)
WAIT_LOG_S = 30.0  # a flush that waits on the brokers says so this often


def as_key(key: str | bytes | None) -> bytes | None:
    return key.encode() if isinstance(key, str) else key


class DeliveryError(RuntimeError):
    """Records sent since the last flush that the brokers refused (after every retry)."""


class RecordProducer:
    """A kafka-python producer that sends undertow records.

    Idempotent with acks=all: a retry after a lost acknowledgement never writes a record twice, and
    an acknowledged record is on every in-sync replica. `flush()` raises DeliveryError if a record
    sent since the last flush was refused, so offsets are never committed past a lost output.
    """

    _PRUNE_EVERY = 10_000  # pending futures before dropping the acknowledged ones (bounded memory without flushes)

    def __init__(self, settings: KafkaSettings, **overrides: Any):
        # A record waits out a broker's outage (up to `outage_wait_s`; kafka-python's default of 120 s
        # failed the records of a single broker down for two minutes), and so does a send that finds the
        # buffer full or the metadata missing meanwhile.
        # A leader cut off from its peers (a network partition the producer is not on) answers
        # REQUEST_TIMED_OUT, which refreshes no metadata: the producer retried against it until its
        # metadata aged out (300 s by default) while the others had elected a new leader long before.
        wait_ms = int(settings.outage_wait_s * 1000)
        kw = dict(acks="all", enable_idempotence=True, linger_ms=5, retries=2**31 - 1,
                  max_request_size=MAX_MESSAGE_BYTES, request_timeout_ms=30000, metadata_max_age_ms=30000,
                  delivery_timeout_ms=max(wait_ms, 120_000), max_block_ms=max(wait_ms, 60_000))
        kw.update(overrides)
        self._producer = connect(KafkaProducer, settings, **kw)
        self._unflushed: list[FutureRecordMetadata] = []
        self._prune_at = self._PRUNE_EVERY

    def send(self, topic: str, record: Record, key: str | bytes | None = None,
             partition: int | None = None) -> FutureRecordMetadata:
        """Encode and send one record; the returned future resolves once the brokers acknowledge it."""
        return self.send_bytes(topic, encode(record), key, partition)

    def send_bytes(self, topic: str, value: bytes, key: str | bytes | None = None,
                   partition: int | None = None) -> FutureRecordMetadata:
        """Send already-encoded bytes (replays, relays, and tests of hostile input)."""
        future = self._producer.send(topic, value=value, key=as_key(key), partition=partition)
        self._unflushed.append(future)
        if len(self._unflushed) >= self._prune_at:
            self._prune()
        return future

    def _prune(self) -> None:
        """Drop the acknowledged futures (failed ones stay for flush() to raise). What is still pending
        stays too, so the next prune waits until the list has doubled: a burst of sends ahead of the
        acknowledgements (a replay) costs O(1) per send, not a scan of everything in flight."""
        self._unflushed = [f for f in self._unflushed if not (f.is_done and f.succeeded())]
        self._prune_at = max(self._PRUNE_EVERY, 2 * len(self._unflushed))

    def reject(self, topic: str, *, stage: str, reason: str, detail: str = "", original: bytes = b"",
               key: bytes | None = None, source_topic: str | None = None, partition: int | None = None,
               offset: int | None = None, record_id: str | None = None) -> FutureRecordMetadata:
        """Send a Rejected record to the dead-letter topic `topic`."""
        rejected = Rejected.of(stage, reason, original, detail=detail, original_key=key, topic=source_topic,
                               partition=partition, offset=offset, record_id=record_id)
        return self.send(topic, rejected, key=record_id or key)

    def flush(self, timeout: float | None = None) -> None:
        """Wait for every record sent so far; raise DeliveryError if any was refused. Without `timeout`,
        waits as long as the records may (an outage: up to `outage_wait_s`), saying every 30 s what waits."""
        if timeout is not None:
            self._producer.flush(timeout)
        else:
            since = time.monotonic()
            while True:
                try:
                    self._producer.flush(WAIT_LOG_S)
                    break
                except KafkaTimeoutError:
                    pending = sum(not f.is_done for f in self._unflushed)
                    log.warning("kafka: %d record(s) wait for the brokers' acknowledgement (%.0f s so far)",
                                pending, time.monotonic() - since)
        failed = [f for f in self._unflushed if f.is_done and f.failed()]
        self._unflushed = [f for f in self._unflushed if not f.is_done]
        self._prune_at = max(self._PRUNE_EVERY, 2 * len(self._unflushed))
        if failed:
            raise DeliveryError(f"{len(failed)} record(s) not delivered; first: {failed[0].exception!r}")

    def close(self, timeout: float | None = None) -> None:
        self._producer.close(timeout)

    def __enter__(self) -> "RecordProducer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.flush()
        self.close()


assert MAX_RECORD_BYTES <= MAX_MESSAGE_BYTES, "a valid record must fit in one Kafka message"
