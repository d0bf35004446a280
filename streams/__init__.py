"""Kafka plumbing: settings, the topic catalog, admin, record producer/consumer, Faust apps."""

from undertow.streams.admin import Growth, TopicInfo, TopicNotFound, create_topics, grow_topics, describe_topics, list_topics, record_counts
from undertow.streams.connect import KafkaUnreachable, connect
from undertow.streams.context import RunContext
from undertow.streams.consumer import CommitRefused, Delivery, GroupLag, RecordConsumer
from undertow.streams.producer import DeliveryError, RecordProducer
from undertow.streams.settings import BOOTSTRAP_ENV, KafkaSettings
from undertow.streams.topics import CATALOG, NAMESPACE_PATTERN, SCALED, TopicSpec, Topics, TopicsConfig

__all__ = [
    "BOOTSTRAP_ENV", "CATALOG", "Delivery", "DeliveryError", "GroupLag", "KafkaSettings", "KafkaUnreachable", "NAMESPACE_PATTERN",
    "CommitRefused", "Growth", "RecordConsumer", "RecordProducer", "RunContext", "SCALED", "TopicInfo", "TopicNotFound", "TopicSpec", "Topics", "TopicsConfig", "connect", "create_topics", "grow_topics", "describe_topics", "list_topics", "record_counts",
]
