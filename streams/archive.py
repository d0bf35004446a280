"""`undertow archive`: copy chosen topics of a namespace into the Parquet archive as they flow.

The archiver assigns itself every partition of the chosen topics and starts each at the offset the
archive on disk says comes next (`ArchiveStore.recover`), not at a consumer-group offset: the files
are the truth, so a crash at any point neither loses nor repeats a row. It still commits its
positions to its consumer group so that `undertow status` shows its lag.

A message that does not decode is archived as a Rejected row (stage "archive", the reason, the
original bytes) in the same range: every offset of a topic has exactly one row. It is not sent to
the rejected topic again: the stage that consumes that topic already dead-letters it there.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from undertow.kernel.progress import Bar

from undertow.schemas import DecodeError, Rejected, WeightUpdate, decode, record_types
from undertow.streams.archive_store import ArchivedMessage, ArchiveStore
from undertow.streams.consumer import Partition, RecordConsumer
from undertow.streams.context import RunContext
from undertow.streams.topics import CATALOG

ARCHIVABLE = tuple(spec.suffix for spec in CATALOG if spec.suffix != "weights")  # weights: blobs, kept elsewhere
DEFAULT_TOPICS = ["experiences.raw", "experiences.ready", "experiences.rejected", "metrics", "task-stats"]
STAGE = "archive"


class ArchiveConfig(BaseModel):
    """The `archive:` section of a run config."""

    model_config = ConfigDict(extra="forbid")

    root: str = Field("~/.undertow/archive", description="archive directory or URI (s3://…, gs://…, any fsspec URI)")
    topics: list[str] = Field(default_factory=lambda: list(DEFAULT_TOPICS),
                              description=f"topic suffixes to archive, of {list(ARCHIVABLE)}")
    flush_records: int = Field(2000, ge=1, description="write files once this many rows are buffered")
    flush_seconds: float = Field(5.0, gt=0, description="write files at least this often while data flows")
    consumer_group: str = Field("undertow-archive", description="consumer group its positions are committed to")
    poll_timeout_ms: int = Field(500, ge=1, description="longest wait for data per poll")

    @field_validator("topics")
    @classmethod
    def _known_topics(cls, topics: list[str]) -> list[str]:
        unknown = [t for t in topics if t not in ARCHIVABLE]
        if unknown or not topics:
            raise ValueError(f"expected a non-empty list of {list(ARCHIVABLE)}, got unknown {unknown}")
        return topics


@dataclass
class ArchiveStats:
    """What one archiver run wrote."""

    rows: int = 0
    files: int = 0
    undecodable: int = 0
    seconds: float = 0.0
    rows_by_topic: dict[str, int] = field(default_factory=dict)

    @property
    def rows_per_s(self) -> float:
        return self.rows / self.seconds if self.seconds else 0.0


@dataclass
class _Buffer:
    """Messages of one partition since the last flush; `first` is where the range starts."""

    first: int
    messages: list[ArchivedMessage] = field(default_factory=list)


def archived(value: bytes, topic: str, partition: int, offset: int, timestamp_ms: int,
             key: bytes | None) -> ArchivedMessage:
    """A message as the archive keeps it: its record, or a Rejected row saying why it did not decode."""
    expect = tuple(c for c in record_types().values() if c is not WeightUpdate)
    try:
        record = decode(value, expect=expect)
    except DecodeError as e:
        record = Rejected.of(STAGE, e.reason, value, detail=e.detail, original_key=key, topic=topic,
                             partition=partition, offset=offset, record_id=e.record_id)
    return ArchivedMessage(record, partition, offset, timestamp_ms, key)


class Archiver:
    """Consumes the chosen topics of the context's namespace and writes them to the archive in flushed ranges."""

    def __init__(self, cfg: ArchiveConfig, context: RunContext):
        namespace = context.namespace
        self.cfg, self.namespace = cfg, namespace
        self.store = ArchiveStore(cfg.root, namespace)
        self.suffix_of = {f"{namespace}.{s}": s for s in cfg.topics}
        # Its group only records positions (for `undertow status`): it reads undecoded, dead-letters nothing.
        self.consumer = RecordConsumer(context.kafka, [], group_id=cfg.consumer_group)
        self.buffers: dict[Partition, _Buffer] = {}
        self.stats = ArchiveStats()
        self.bar = Bar()  # advanced by the rows of each flush
        self._assign()

    def _assign(self) -> None:
        """Each partition from where its files end, else from its first record (never the group's commit)."""
        firsts = self.consumer.assign(self.suffix_of, "earliest")  # a missing topic: TopicNotFound
        resume = {(topic, p): o for topic, suffix in self.suffix_of.items()
                  for p, o in self.store.recover(suffix).items()}
        starts = self.consumer.assign(self.suffix_of, {**firsts, **resume})
        self.buffers = {p: _Buffer(first=offset) for p, offset in starts.items()}

    def run(self, should_stop: Callable[[], bool], max_records: int | None = None,
            idle_timeout_s: float | None = None, bar: Bar | None = None) -> ArchiveStats:
        """Archive until `should_stop()`, `max_records` rows, or `idle_timeout_s` without data; then flush."""
        self.bar = bar or self.bar
        started = last_data = last_flush = time.monotonic()
        try:
            while not should_stop() and (max_records is None or self.stats.rows + self._buffered() < max_records):
                limit = None if max_records is None else max_records - self.stats.rows - self._buffered()
                if self._poll(limit):
                    last_data = time.monotonic()
                now = time.monotonic()
                if self._buffered() >= self.cfg.flush_records or now - last_flush >= self.cfg.flush_seconds:
                    self.flush()
                    last_flush = now
                if idle_timeout_s is not None and now - last_data >= idle_timeout_s:
                    break
            self.flush()
        finally:
            self.stats.seconds = time.monotonic() - started
            self.consumer.close()
        return self.stats

    def _buffered(self) -> int:
        return sum(len(b.messages) for b in self.buffers.values())

    def _poll(self, limit: int | None) -> int:
        messages = self.consumer.poll_messages(timeout_ms=self.cfg.poll_timeout_ms, max_records=limit)
        for m in messages:
            row = archived(m.value, m.topic, m.partition, m.offset, m.timestamp_ms, m.key)
            on_rejected_topic = self.suffix_of[m.topic] == "experiences.rejected"
            self.stats.undecodable += isinstance(row.record, Rejected) and not on_rejected_topic
            self.buffers[(m.topic, m.partition)].messages.append(row)
        return len(messages)

    def flush(self) -> None:
        """Write every partition's buffered range, then commit the positions to the consumer group."""
        commits = {}
        positions = self.consumer.positions()
        for (topic, partition), buffer in self.buffers.items():
            end = positions[(topic, partition)]  # next offset: the range ends just before it
            if not buffer.messages:
                # Nothing decodable consumed (or nothing at all): the range starts at the position.
                buffer.first = end if end is not None else buffer.first
                continue
            suffix = self.suffix_of[topic]
            last = max(end - 1, buffer.messages[-1].offset)
            paths = self.store.write_range(suffix, topic, partition, buffer.first, last, buffer.messages)
            self.stats.files += len(paths)
            self.stats.rows += len(buffer.messages)
            self.stats.rows_by_topic[suffix] = self.stats.rows_by_topic.get(suffix, 0) + len(buffer.messages)
            self.bar.advance(len(buffer.messages))
            self.buffers[(topic, partition)] = _Buffer(first=last + 1)
            commits[(topic, partition)] = last + 1
        if commits:
            self.consumer.commit(commits)
