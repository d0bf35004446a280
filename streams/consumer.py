"""Consuming records: decode and validate every message; what fails goes to the rejected topic."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Iterable, Iterator, Literal, Mapping, TypeVar

from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition
from kafka.errors import CommitFailedError, RebalanceInProgressError

from undertow.schemas import DecodeError, Record, decode, record_types
from undertow.streams.admin import topic_partitions
from undertow.streams.connect import connect, outlast
from undertow.streams.producer import RecordProducer
from undertow.streams.settings import KafkaSettings

R = TypeVar("R", bound=Record)

Partition = tuple[str, int]  # (topic, partition); kafka's TopicPartition is one too
Offsets = dict[Partition, int]
# Where `assign` starts each partition: its first record, its end (only what comes next), the
# group's committed offset (else the first record), or explicit offsets (the others: committed).
Start = Literal["earliest", "latest", "committed"] | Mapping[Partition, int]


REBALANCE_TRIES, REBALANCE_WAIT_S = 30, 1.0  # a commit waits out a rebalance this long (30 s), then is refused


class CommitRefused(Exception):
    """The group took this member for dead (a broker outage longer than its session, a loop that did
    not poll in time) and moved its partitions: nothing was committed, the next poll rejoins, and
    whoever holds those partitions now reads their records again."""


@dataclass
class Message:
    """One message as it is on the topic, not decoded (for readers that show what does not decode)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int


@dataclass
class Delivery(Generic[R]):
    """One decoded record and where it came from."""

    record: R
    topic: str
    partition: int
    offset: int
    key: bytes | None
    timestamp_ms: int


class RecordConsumer(Generic[R]):
    """A kafka-python consumer that yields validated records and dead-letters the rest.

    Offsets are never committed automatically: call `commit()` once the work covering the
    records returned so far is done (at-least-once). A message that does not decode as one of
    `expect` is sent to `rejected_topic` with stage, reason and the original bytes, and consumption
    goes on; `commit()` flushes those dead letters before it moves the offsets past them. Without a
    `rejected_topic` (readers of `poll_messages`, which decode nothing) a bad record raises instead.
    """

    def __init__(self, settings: KafkaSettings, topics: list[str], *, group_id: str | None,
                 expect: type[R] | tuple[type[Record], ...] | None = None, rejected_topic: str | None = None,
                 producer: RecordProducer | None = None, stage: str = "decode", **overrides: Any):
        # A crashed member's partitions move to the others after 10 s (kafka-python's default is 45 s).
        kw = dict(group_id=group_id, enable_auto_commit=False, auto_offset_reset="earliest",
                  max_partition_fetch_bytes=32 << 20, fetch_max_bytes=64 << 20,
                  session_timeout_ms=10_000, heartbeat_interval_ms=3_000,
                  # Partitions added to a live topic (`undertow topics create --partitions`) reach a running
                  # member at its next metadata refresh: 30 s, not kafka-python's 5 min.
                  metadata_max_age_ms=30_000)
        kw.update(overrides)
        self._consumer = connect(KafkaConsumer, settings, *topics, **kw)
        # Made at the first dead letter: a reader that never meets one opens no producer connection.
        self._settings, self._owns_producer, self._producer = settings, producer is None, producer
        self.expect = tuple(record_types().values()) if expect is None else expect
        self.rejected_topic, self.stage = rejected_topic, stage
        self.rejected = 0

    def assign(self, topics: str | Iterable[str], start: Start = "committed") -> Offsets:
        """Read every partition of `topics` (and nothing else, no group rebalancing) from `start`;
        returns the offset each partition starts at. A missing topic raises TopicNotFound."""
        names = [topics] if isinstance(topics, str) else list(topics)
        # A broker's outage (the trainer restarting while one is down) is waited out, not a crash.
        parts = [tp for topic in names
                 for tp in outlast(self._settings, f"the partitions of {topic}", topic_partitions, self._consumer, topic)]
        self._consumer.assign(parts)
        offsets = self._start_offsets(parts, start)
        for tp in parts:
            self._consumer.seek(tp, offsets[(tp.topic, tp.partition)])
        return offsets

    def end_offsets(self) -> Offsets:
        """The offset after the last record of each assigned partition, now."""
        return _keyed(self._consumer.end_offsets(list(self._consumer.assignment())))

    def positions(self) -> Offsets:
        """The next offset this consumer reads of each assigned partition."""
        return {(tp.topic, tp.partition): self._consumer.position(tp) for tp in self._consumer.assignment()}

    def reached(self, offsets: Offsets) -> bool:
        """Whether this consumer has read up to `offsets` (e.g. the end offsets of when it started)."""
        return all(self._consumer.position(TopicPartition(*p)) >= o for p, o in offsets.items())

    def pause(self, partitions: Iterable[Partition] | None = None) -> None:
        """Fetch nothing from `partitions` (default: every assigned one) until `resume()`."""
        self._consumer.pause(*self._partitions(partitions))

    def resume(self, partitions: Iterable[Partition] | None = None) -> None:
        self._consumer.resume(*self._partitions(partitions))

    def idle(self, seconds: float) -> None:
        """Take no record for `seconds` but stay a live member of the group (a consumer that stops
        polling is taken for dead and its partitions move). A partition assigned meanwhile by a
        rebalance is not paused: what it delivered is sought back to, so it is read again, not lost."""
        self.pause()
        try:
            for tp, messages in self._consumer.poll(timeout_ms=int(seconds * 1000)).items():
                if messages:
                    self._consumer.seek(tp, messages[0].offset)
        finally:
            self.resume()

    def poll(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[Delivery[R]]:
        """Fetch, decode and validate; returns only good records, in partition order."""
        batches = self._consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        out: list[Delivery[R]] = []
        for tp, messages in batches.items():
            for m in messages:
                try:
                    record = decode(m.value or b"", expect=self.expect)
                except DecodeError as e:
                    self._dead_letter(m, e)
                    continue
                out.append(Delivery(record, tp.topic, tp.partition, m.offset, m.key, m.timestamp))
        return out

    def give_back(self, deliveries: list[Delivery[Any]]) -> None:
        """Return fetched records not worked on: the next poll reads them again (each partition goes back
        to its earliest one given). Nothing is committed; only what follows them in a partition is re-read."""
        first: dict[Partition, int] = {}
        for d in deliveries:
            first[(d.topic, d.partition)] = min(d.offset, first.get((d.topic, d.partition), d.offset))
        for (topic, partition), offset in first.items():
            self._consumer.seek(TopicPartition(topic, partition), offset)

    def poll_messages(self, timeout_ms: int = 1000, max_records: int | None = None) -> list[Message]:
        """Fetch without decoding: nothing is validated, nothing dead-lettered (`undertow tail`)."""
        batches = self._consumer.poll(timeout_ms=timeout_ms, max_records=max_records)
        return [Message(tp.topic, tp.partition, m.offset, m.key, m.value or b"", m.timestamp)
                for tp, messages in batches.items() for m in messages]

    def __iter__(self) -> Iterator[Delivery[R]]:
        """Yield records forever (until the consumer is closed)."""
        while True:
            yield from self.poll()

    def commit(self, offsets: Mapping[Partition, int] | None = None) -> None:
        """Commit `offsets` (next offset to read, per (topic, partition)) or the current positions. Raises
        CommitRefused when the group had already taken this member for dead and moved its partitions."""
        if self._producer is not None:
            self._producer.flush()
        args = () if offsets is None else ({TopicPartition(*p): OffsetAndMetadata(o, "", -1) for p, o in offsets.items()},)
        for _ in range(REBALANCE_TRIES):
            try:
                outlast(self._settings, "a commit", self._consumer.commit, *args)
                return
            except RebalanceInProgressError:
                # A member joined or left while this batch ran: rejoin (taking no record), then commit
                # again, as the broker asks. Refusing it instead, this member's whole batch was generated
                # again by whoever read its partitions next (a worker thread also died of the error).
                self.idle(REBALANCE_WAIT_S)
            except CommitFailedError as e:
                self._rewind_to_committed()
                raise CommitRefused(str(e)) from None
        self._rewind_to_committed()
        raise CommitRefused(f"the group was still rebalancing after {REBALANCE_TRIES} tries")

    def _rewind_to_committed(self) -> None:
        """After a refused commit, read again from the group's committed offsets: kafka-python keeps the
        position of a partition it is assigned again at the rejoin, which would skip what this member
        had read and not committed."""
        parts = list(self._consumer.assignment())
        first = _keyed(self._consumer.beginning_offsets(parts)) if parts else {}
        for partition, offset in first.items():
            self._consumer.seek(TopicPartition(*partition), self._committed(partition, otherwise=offset))

    def close(self) -> None:
        self._consumer.close()
        if self._owns_producer and self._producer is not None:
            self._producer.close()

    def __enter__(self) -> "RecordConsumer[R]":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _partitions(self, partitions: Iterable[Partition] | None) -> list[TopicPartition]:
        if partitions is None:
            return list(self._consumer.assignment())
        return [TopicPartition(*p) for p in partitions]

    def _start_offsets(self, parts: list[TopicPartition], start: Start) -> Offsets:
        if isinstance(start, str) and start not in ("earliest", "latest", "committed"):
            raise ValueError(f"start: expected earliest, latest, committed or offsets, got {start!r}")
        if start == "latest":
            return _keyed(self._consumer.end_offsets(parts))
        first = _keyed(self._consumer.beginning_offsets(parts))
        if start == "earliest":
            return first
        explicit = {} if isinstance(start, str) else start
        return {p: explicit[p] if p in explicit else self._committed(p, otherwise=first[p]) for p in first}

    def _committed(self, partition: Partition, *, otherwise: int) -> int:
        """The group's committed offset, else `otherwise` (a consumer without a group commits nothing)."""
        committed = self._consumer.committed(TopicPartition(*partition)) if self._consumer.config["group_id"] else None
        return otherwise if committed is None else committed

    def _dead_letter(self, m: Any, error: DecodeError) -> None:
        if self.rejected_topic is None:
            raise error
        self.rejected += 1
        if self._producer is None:
            self._producer = RecordProducer(self._settings)
        self._producer.reject(self.rejected_topic, stage=self.stage, reason=error.reason, detail=error.detail,
                              original=m.value or b"", key=m.key, source_topic=m.topic, partition=m.partition,
                              offset=m.offset, record_id=error.record_id)



class GroupLag:
    """Records on a topic past a consumer group's committed offsets: what the group has yet to do."""

    def __init__(self, settings: KafkaSettings, topic: str, group: str):
        self.topic, self.group = topic, group
        # A group member that never subscribes: it reads the group's commits, it does not join.
        self._consumer = connect(KafkaConsumer, settings, group_id=group, enable_auto_commit=False)
        self.parts = topic_partitions(self._consumer, topic)
        self.settings = settings

    def __call__(self) -> int:
        """The lag now; while no broker answers (an outage), waits for one, saying so."""
        return outlast(self.settings, f"the lag of {self.group} on {self.topic}", self._lag)

    def _lag(self) -> int:
        ends = self._consumer.end_offsets(self.parts)
        starts = self._consumer.beginning_offsets(self.parts)  # a committed offset may predate retention
        done = {tp: self._consumer.committed(tp) for tp in self.parts}  # None: nothing committed yet
        return sum(ends[tp] - max(done[tp] or 0, starts[tp]) for tp in self.parts)

    def close(self) -> None:
        self._consumer.close()


def read_messages(settings: KafkaSettings, topic: str, last: int | None = None) -> Iterator[Message]:
    """Every message on `topic` (or the `last` of each partition) up to its end offsets of now, each
    partition in offset order: a topic read once, undecoded (audits, history views, status)."""
    with RecordConsumer(settings, [], group_id=None) as consumer:
        firsts = consumer.assign(topic, "earliest")
        ends = consumer.end_offsets()
        if last is not None:
            consumer.assign(topic, {p: max(firsts[p], ends[p] - last) for p in ends})
        while not consumer.reached(ends):
            for m in consumer.poll_messages(timeout_ms=500):
                if m.offset < ends[(m.topic, m.partition)]:
                    yield m
            # What is written after the start is not this read's: stop fetching partitions that are done.
            consumer.pause(p for p, o in consumer.positions().items() if o >= ends[p])


def read_to_end(settings: KafkaSettings, topic: str) -> Iterator[bytes]:
    """The value of every message on `topic` from its beginning to its end offsets of now: a topic
    read whole once (audits, tests, a resuming feeder)."""
    return (m.value for m in read_messages(settings, topic))


def _keyed(offsets: Mapping[TopicPartition, int]) -> Offsets:
    return {(tp.topic, tp.partition): o for tp, o in offsets.items()}
