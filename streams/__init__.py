"""Kafka plumbing: settings, the topic catalog, admin, record producer/consumer, Faust apps."""

from undertow.streams.admin import TopicInfo, TopicNotFound, create_topics, describe_topics, list_topics, record_counts
from undertow.streams.connect import KafkaUnreachable, connect
from undertow.streams.context import RunContext
from undertow.streams.consumer import Delivery, GroupLag, RecordConsumer
from undertow.streams.producer import DeliveryError, RecordProducer
from undertow.streams.settings import BOOTSTRAP_ENV, KafkaSettings
from undertow.streams.topics import CATALOG, NAMESPACE_PATTERN, TopicSpec, Topics

__all__ = [
    "BOOTSTRAP_ENV", "CATALOG", "Delivery", "DeliveryError", "GroupLag", "KafkaSettings", "KafkaUnreachable", "NAMESPACE_PATTERN",
    "RecordConsumer", "RecordProducer", "RunContext", "TopicInfo", "TopicNotFound", "TopicSpec", "Topics", "connect", "create_topics", "describe_topics", "list_topics", "record_counts",
]
