"""Kafka plumbing: settings, the topic catalog, admin, record producer/consumer, Faust apps."""

from streams.admin import TopicInfo, create_topics, describe_topics, list_topics, record_counts
from streams.consumer import Delivery, RecordConsumer
from streams.producer import RecordProducer
from streams.settings import BOOTSTRAP_ENV, KafkaSettings
from streams.topics import CATALOG, TopicSpec, Topics

__all__ = [
    "BOOTSTRAP_ENV", "CATALOG", "Delivery", "KafkaSettings", "RecordConsumer", "RecordProducer", "TopicInfo",
    "TopicSpec", "Topics", "create_topics", "describe_topics", "list_topics", "record_counts",
]
