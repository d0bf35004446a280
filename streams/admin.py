"""Topic administration: create the catalog, list and describe what the cluster holds."""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition
from kafka.admin import ConfigResource, ConfigResourceType, NewPartitions
from kafka.errors import NodeNotReadyError, UnknownBrokerIdError

from undertow.streams.connect import connect
from undertow.streams.settings import KafkaSettings
from undertow.streams.topics import Topics

CREATE_ATTEMPTS = 5
# How long a describe waits for a topic the answering broker does not know: one created a moment ago
# on another broker of a cluster reaches every broker's metadata a little later.
UNKNOWN_TOPIC_WAIT_S = 5.0
Offsets = dict[tuple[str, int], int]  # per (topic, partition), as streams.consumer's


@dataclass
class TopicInfo:
    """What the cluster says about one topic."""

    name: str
    partitions: int
    replication_factor: int
    records: int  # end offset minus start offset, summed over partitions
    configs: dict[str, str]


@contextmanager
def admin_client(settings: KafkaSettings, **overrides: Any) -> Iterator[KafkaAdminClient]:
    admin = connect(KafkaAdminClient, settings, **{"request_timeout_ms": 30000, **overrides})
    try:
        yield admin
    finally:
        admin.close()


def cluster_size(settings: KafkaSettings) -> int:
    """Number of live brokers."""
    with admin_client(settings) as admin:
        return len(admin.describe_cluster()["brokers"])


def serving_brokers(settings: KafkaSettings, **overrides: Any) -> set[int]:
    """Ids of the brokers the cluster lists and has not fenced (a starting node is fenced until it
    caught up). `overrides` go to the admin client (a starting cluster wants short timeouts)."""
    with admin_client(settings, **overrides) as admin:
        return {b["broker_id"] for b in admin.describe_cluster()["brokers"] if not b.get("is_fenced")}


def committed_offsets(settings: KafkaSettings) -> dict[str, Offsets]:
    """Every consumer group's committed offsets (the next to read), per (topic, partition)."""
    with admin_client(settings) as admin:
        groups = sorted({g["group_id"] if isinstance(g, dict) else g[0] for g in admin.list_groups()})
        return {g: {(tp.topic, tp.partition): meta.offset
                    for tp, meta in admin.list_group_offsets({g: None}).get(g, {}).items() if meta.offset >= 0}
                for g in groups}


class TopicNotFound(RuntimeError):
    """A topic that a component reads does not exist, or (a broker with ACLs hides what a login may
    not describe) is not this login's to see; the message says how to make it or grant it."""

    def __init__(self, topic: str, login: str | None = None):
        hidden = (f", or the broker hides it from {login} (no ACL allows it Describe, Read or Write: "
                  f"`undertow acls CONFIG --apply`)") if login else ""
        super().__init__(f"topic {topic} does not exist{hidden}: run `undertow topics create` first")
        self.topic = topic


def topic_partitions(consumer: KafkaConsumer, topic: str) -> list[TopicPartition]:
    """Every partition of `topic`, in order. A missing topic raises TopicNotFound: reading a guessed
    partition 0 instead would wait for ever on a topic nobody writes."""
    parts = consumer.partitions_for_topic(topic)  # asks the cluster when its metadata cache has no such topic
    if not parts:
        raise TopicNotFound(topic, login_of(consumer.config))
    return [TopicPartition(topic, p) for p in sorted(parts)]


def login_of(config: dict) -> str | None:
    """Who a kafka-python client logs in as, in words: its SASL user, or the holder of its certificate."""
    if config.get("sasl_plain_username"):
        return f"User:{config['sasl_plain_username']}"
    return f"the principal of {config['ssl_certfile']}" if config.get("ssl_certfile") else None


def partition_count(settings: KafkaSettings, topic: str) -> int:
    """How many partitions `topic` has; a missing topic raises TopicNotFound."""
    consumer = connect(KafkaConsumer, settings)
    try:
        return len(topic_partitions(consumer, topic))
    finally:
        consumer.close()


def create_topics(settings: KafkaSettings, namespace: str, replication_factor: int | None = None,
                  partitions: dict[str, int] | None = None, shadow: str | None = None) -> list[str]:
    """Create the catalog's topics under `namespace` that do not exist yet; return those created.

    Replication defaults to min(3, brokers). `partitions` overrides the catalog per suffix; `shadow`
    adds a shadow trainer's own topics.
    """
    args = (settings, Topics(namespace, shadow), replication_factor, partitions or {})
    for attempt in range(1, CREATE_ATTEMPTS):
        try:
            return _create_missing(*args)
        except (UnknownBrokerIdError, NodeNotReadyError):
            # Just after brokers start, a new client can be told the controller's id before its
            # metadata lists that broker; kafka-python then fails at once rather than waiting.
            time.sleep(attempt)
    return _create_missing(*args)


def _create_missing(settings: KafkaSettings, topics: Topics, replication_factor: int | None,
                    partitions: dict[str, int]) -> list[str]:
    with admin_client(settings) as admin:
        rf = replication_factor or min(3, len(admin.describe_cluster()["brokers"]))
        existing = set(admin.list_topics())
        new = {
            name: {"num_partitions": partitions.get(spec.suffix, spec.partitions),
                   "replication_factor": rf, "configs": spec.topic_configs(rf)}
            for name, spec in topics.specs().items() if name not in existing
        }
        if new:
            admin.create_topics(new, timeout_ms=30000, wait_for_metadata=True)
    return sorted(new)


@dataclass
class Growth:
    """One topic given more partitions: its count before and after."""

    topic: str
    before: int
    after: int


def grow_topics(settings: KafkaSettings, namespace: str, partitions: dict[str, int]) -> list[Growth]:
    """Add partitions to the namespace's topics that have fewer than `partitions` (per suffix) asks.

    Kafka never removes partitions: a topic that has more keeps them. The processors' Faust changelog
    topics (`<namespace>…-changelog`) that had as many partitions as experiences.raw grow with it: a
    processor worker restarted on a grown raw topic writes its tables' changes to the new partitions, and
    crashed on a changelog without them (`AssertionError: Unrecognized partition`, README "Scaling out").
    Keys hash to `murmur2(key) % partitions`, so after a growth a key may map to another partition
    (README, "Scaling out": what that means for a prompt group open at that moment)."""
    topics = Topics(namespace)
    wanted = {topics.specs_by_suffix()[suffix]: n for suffix, n in partitions.items()}
    with admin_client(settings) as admin:
        names = [t for t in admin.list_topics() if t in wanted or _changelog_of(t, namespace)]
        have = {t["name"]: len(t["partitions"]) for t in admin.describe_topics(names) if not t.get("error_code")}
        raw = topics.raw
        if raw in wanted and raw in have:
            for t in names:
                if _changelog_of(t, namespace) and have.get(t) == have[raw]:
                    wanted[t] = wanted[raw]
        growth = [Growth(t, have[t], n) for t, n in sorted(wanted.items()) if t in have and have[t] < n]
        if growth:
            admin.create_partitions({g.topic: NewPartitions(g.after) for g in growth}, timeout_ms=30000)
    return growth


def _changelog_of(topic: str, namespace: str) -> bool:
    return topic.endswith("-changelog") and topic.startswith((f"{namespace}-", f"{namespace}."))


def list_topics(settings: KafkaSettings, namespace: str | None = None) -> list[str]:
    """Topic names in the cluster (only the namespace's when given), internal topics left out."""
    with admin_client(settings) as admin:
        names = [t for t in admin.list_topics() if not t.startswith("__")]
    if namespace:
        names = [t for t in names if t.startswith(f"{namespace}.")]
    return sorted(names)


def describe_topics(settings: KafkaSettings, names: list[str]) -> list[TopicInfo]:
    """Partitions, replication, record counts and non-default configs of each named topic."""
    if not names:
        return []
    with admin_client(settings) as admin:
        deadline = time.monotonic() + UNKNOWN_TOPIC_WAIT_S
        while True:
            meta = {t["name"]: t for t in admin.describe_topics(names)}
            missing = [n for n in names if n not in meta or meta[n].get("error_code")]
            if not missing:
                break
            if time.monotonic() >= deadline:
                raise ValueError(f"topics: no such topic {missing}")
            time.sleep(0.25)
        resources = [ConfigResource(ConfigResourceType.TOPIC, n) for n in names]
        configs = admin.describe_configs(resources)["topic"]
    counts = record_counts(settings, names)
    return [
        TopicInfo(name=n, partitions=len(meta[n]["partitions"]),
                  replication_factor=len(meta[n]["partitions"][0]["replica_nodes"]),
                  records=counts[n],
                  configs={k: str(v.get("value", v)) if isinstance(v, dict) else str(v)
                           for k, v in configs.get(n, {}).items()})
        for n in names
    ]


def record_counts(settings: KafkaSettings, names: list[str]) -> dict[str, int]:
    """Records currently held per topic (end minus beginning offsets, all partitions)."""
    starts, ends = topic_offsets(settings, names)
    out = dict.fromkeys(names, 0)
    for (topic, partition), end in ends.items():
        out[topic] += end - starts[(topic, partition)]
    return out


def topic_offsets(settings: KafkaSettings, names: list[str]) -> tuple[Offsets, Offsets]:
    """(beginning, end) offsets of every partition of each named topic, per (topic, partition); a
    topic that does not exist has none."""
    consumer = connect(KafkaConsumer, settings)
    try:
        parts = [TopicPartition(n, p) for n in names for p in consumer.partitions_for_topic(n) or ()]
        starts, ends = consumer.beginning_offsets(parts), consumer.end_offsets(parts)
        return ({(tp.topic, tp.partition): o for tp, o in starts.items()},
                {(tp.topic, tp.partition): o for tp, o in ends.items()})
    finally:
        consumer.close()
