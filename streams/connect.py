"""Opening kafka-python clients so that a cluster that cannot be reached says what was tried."""

from __future__ import annotations

import logging
import socket
import time
from typing import Any, Callable, TypeVar

from kafka.errors import KafkaError, KafkaTimeoutError

from undertow.streams.settings import KafkaSettings

C = TypeVar("C")
T = TypeVar("T")
log = logging.getLogger(__name__)
RETRY_S = 5.0  # between attempts while no broker listens


class KafkaUnreachable(RuntimeError):
    """No broker accepted a connection made with these settings."""


def connect(client: type[C], settings: KafkaSettings, *args: Any, **kw: Any) -> C:
    """`client(*args, **settings.kafka_python(), **kw)`: a KafkaProducer, KafkaConsumer or KafkaAdminClient.

    Each bootstraps in its constructor. kafka-python 3.0.12 drops the broker's "Authentication
    failed" answer (it arrives together with the close) and reports only "Unable to bootstrap", so a
    wrong password, a wrong protocol and a down broker look alike: a TCP connection tells them apart.
    Where no broker listens (one restarting: a single-broker cluster's outage), wait for one, saying so,
    up to `settings.outage_wait_s`; where one listens and refused us, fail at once naming the settings.
    """
    since = time.monotonic()
    try:
        return _waited_out(settings, lambda: client(*args, **settings.kafka_python(), **kw),
                           lambda e: isinstance(e, KafkaTimeoutError) and not listening(settings.hosts),
                           lambda e: f"no broker listens at {settings.bootstrap_servers}; waiting for one")
    except KafkaTimeoutError as e:
        who = f" as SASL user {settings.sasl_username!r}" if settings.sasl else ""
        raise KafkaUnreachable(
            f"kafka: no broker at {settings.bootstrap_servers} accepted a {settings.security_protocol} "
            f"connection{who} ({e}; waited {time.monotonic() - since:.0f} s); check bootstrap_servers, "
            f"security_protocol and the credentials") from None


def listening(hosts: list[str], timeout_s: float = 2.0) -> bool:
    """Whether any of `hosts` (host:port) accepts a TCP connection."""
    for host in hosts:
        name, _, port = host.rpartition(":")
        try:
            socket.create_connection((name.strip("[]"), int(port)), timeout=timeout_s).close()
            return True
        except (OSError, ValueError):
            continue
    return False


def outlast(settings: KafkaSettings, what: str, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, called again while it fails for want of a broker (a retriable Kafka error: no
    connection, no coordinator, a timeout), logging `what` waits, up to `settings.outage_wait_s`.
    Any other error (a commit refused after a rebalance) is raised at once."""
    return _waited_out(settings, lambda: fn(*args),
                       lambda e: isinstance(e, KafkaError) and getattr(e, "retriable", False),
                       lambda e: f"{what} waits for the brokers at {settings.bootstrap_servers} ({type(e).__name__})")


def _waited_out(settings: KafkaSettings, attempt: Callable[[], T], for_a_broker: Callable[[Exception], bool],
                waiting: Callable[[Exception], str]) -> T:
    """`attempt()`, again every RETRY_S while it fails `for_a_broker` (logging `waiting(error)`), up to
    `settings.outage_wait_s`; any other failure, or the last one, is raised."""
    since = time.monotonic()
    while True:
        try:
            return attempt()
        except Exception as e:
            waited = time.monotonic() - since
            if not for_a_broker(e) or waited + RETRY_S > settings.outage_wait_s:
                raise
            log.warning("kafka: %s (%.0f s so far, at most %.0f s)", waiting(e), waited, settings.outage_wait_s)
            time.sleep(RETRY_S)
