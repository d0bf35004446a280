"""Opening kafka-python clients so that a cluster that cannot be reached says what was tried."""

from __future__ import annotations

from typing import Any, TypeVar

from kafka.errors import KafkaTimeoutError

from undertow.streams.settings import KafkaSettings

C = TypeVar("C")


class KafkaUnreachable(RuntimeError):
    """No broker accepted a connection made with these settings."""


def connect(client: type[C], settings: KafkaSettings, *args: Any, **kw: Any) -> C:
    """`client(*args, **settings.kafka_python(), **kw)`: a KafkaProducer, KafkaConsumer or KafkaAdminClient.

    Each bootstraps in its constructor. kafka-python 3.0.12 drops the broker's "Authentication
    failed" answer (it arrives together with the close) and reports only "Unable to bootstrap", so a
    wrong password, a wrong protocol and a down broker look alike: say which settings were tried.
    """
    try:
        return client(*args, **settings.kafka_python(), **kw)
    except KafkaTimeoutError as e:
        who = f" as SASL user {settings.sasl_username!r}" if settings.sasl else ""
        raise KafkaUnreachable(
            f"kafka: no broker at {settings.bootstrap_servers} accepted a {settings.security_protocol} connection"
            f"{who} ({e}); check bootstrap_servers, security_protocol and the credentials") from None
