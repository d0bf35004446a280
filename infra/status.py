"""What a namespace looks like right now: topics, consumer groups and their lag, the latest policy."""

from __future__ import annotations

from dataclasses import dataclass

from kafka import KafkaConsumer, TopicPartition

from schemas import DecodeError, WeightUpdate, decode
from streams import KafkaSettings, Topics, connect, list_topics
from streams.admin import admin_client


@dataclass
class GroupLag:
    group: str
    topic: str
    committed: int
    end: int

    @property
    def lag(self) -> int:
        return self.end - self.committed


@dataclass
class NamespaceStatus:
    records: dict[str, int]  # topic -> records held
    groups: list[GroupLag]
    policy_version: int | None  # newest WeightUpdate version on the weights topic


def namespace_status(kafka: KafkaSettings, namespace: str) -> NamespaceStatus:
    """Record counts per topic, lag per consumer group and topic, and the latest policy version."""
    topics = list_topics(kafka, namespace)
    consumer = connect(KafkaConsumer, kafka)
    try:
        parts = {t: [TopicPartition(t, p) for p in consumer.partitions_for_topic(t) or ()] for t in topics}
        every = [tp for tps in parts.values() for tp in tps]
        ends, starts = consumer.end_offsets(every), consumer.beginning_offsets(every)
        records = {t: sum(ends[tp] - starts[tp] for tp in tps) for t, tps in parts.items()}
        groups = _group_lags(kafka, set(topics), ends)
        version = _latest_version(consumer, Topics(namespace).weights, parts.get(Topics(namespace).weights, []), ends)
    finally:
        consumer.close()
    return NamespaceStatus(records, groups, version)


def _group_lags(kafka: KafkaSettings, topics: set[str], ends: dict[TopicPartition, int]) -> list[GroupLag]:
    with admin_client(kafka) as admin:
        group_ids = sorted({g["group_id"] if isinstance(g, dict) else g[0] for g in admin.list_groups()})
        out: list[GroupLag] = []
        for gid in group_ids:
            offsets = admin.list_group_offsets({gid: None}).get(gid, {})
            per_topic: dict[str, list[tuple[int, int]]] = {}
            for tp, meta in offsets.items():
                if tp.topic in topics and meta.offset >= 0:
                    per_topic.setdefault(tp.topic, []).append((meta.offset, ends.get(tp, meta.offset)))
            out += [GroupLag(gid, t, sum(c for c, _ in v), sum(e for _, e in v)) for t, v in sorted(per_topic.items())]
    return out


def _latest_version(consumer: KafkaConsumer, topic: str, parts: list[TopicPartition],
                    ends: dict[TopicPartition, int]) -> int | None:
    """The version of the newest WeightUpdate (reads the last few records of each partition)."""
    if not parts:
        return None
    consumer.assign(parts)
    for tp in parts:
        consumer.seek(tp, max(0, ends[tp] - 8))
    versions = []
    for batch in consumer.poll(timeout_ms=3000).values():
        for m in batch:
            try:
                versions.append(decode(m.value, expect=WeightUpdate).version)
            except DecodeError:
                continue
    return max(versions, default=None)
