"""What a namespace looks like right now: topics, consumer groups and their lag, the latest policy."""

from __future__ import annotations

from dataclasses import dataclass

from undertow.schemas import DecodeError, WeightUpdate, decode
from undertow.streams import KafkaSettings, Topics, list_topics
from undertow.streams.admin import committed_offsets, topic_offsets
from undertow.streams.consumer import read_messages


@dataclass
class LagReading:
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
    groups: list[LagReading]
    policy_version: int | None  # newest WeightUpdate version on the weights topic


def namespace_status(kafka: KafkaSettings, namespace: str) -> NamespaceStatus:
    """Record counts per topic, lag per consumer group and topic, and the latest policy version."""
    topics = list_topics(kafka, namespace)
    starts, ends = topic_offsets(kafka, topics)
    records = dict.fromkeys(topics, 0)
    for p, end in ends.items():
        records[p[0]] += end - starts[p]
    return NamespaceStatus(records, _group_lags(kafka, starts, ends),
                           _latest_version(kafka, Topics(namespace).weights, topics))


def _group_lags(kafka: KafkaSettings, starts: dict[tuple[str, int], int],
                ends: dict[tuple[str, int], int]) -> list[LagReading]:
    """Per group and topic of the namespace: what the group committed and the topic's end, summed. A
    partition of the topic the group has not committed yet (new, or grown) counts from its beginning:
    the group reads it from there (auto_offset_reset earliest), so that is its backlog."""
    out: list[LagReading] = []
    for group, committed in committed_offsets(kafka).items():
        per_topic: dict[str, list[tuple[int, int]]] = {}
        read = {p[0] for p in committed if p in ends}
        for p, end in ends.items():
            if p[0] in read:
                per_topic.setdefault(p[0], []).append((committed.get(p, starts[p]), end))
        out += [LagReading(group, t, sum(c for c, _ in v), sum(e for _, e in v)) for t, v in sorted(per_topic.items())]
    return out


def _latest_version(kafka: KafkaSettings, topic: str, topics: list[str]) -> int | None:
    """The version of the newest WeightUpdate (reads the last few records of each partition)."""
    if topic not in topics:
        return None
    versions = []
    for m in read_messages(kafka, topic, last=8):
        try:
            versions.append(decode(m.value, expect=WeightUpdate).version)
        except DecodeError:
            continue
    return max(versions, default=None)
