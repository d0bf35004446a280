"""Kafka plumbing: settings, the topic catalog, admin, record producer/consumer, Faust apps."""

from streams.admin import TopicInfo, create_topics, describe_topics, list_topics, record_counts
from streams.connect import KafkaUnreachable, connect
from streams.consumer import Delivery, RecordConsumer
from streams.producer import DeliveryError, RecordProducer
from streams.settings import BOOTSTRAP_ENV, KafkaSettings
from streams.topics import CATALOG, NAMESPACE_PATTERN, TopicSpec, Topics

__all__ = [
    "BOOTSTRAP_ENV", "CATALOG", "Delivery", "DeliveryError", "KafkaSettings", "KafkaUnreachable", "NAMESPACE_PATTERN",
    "RecordConsumer", "RecordProducer", "TopicInfo", "TopicSpec", "Topics", "connect", "create_topics", "describe_topics", "list_topics", "record_counts",
]
