"""Opening kafka-python clients so that a cluster that cannot be reached says what was tried."""

from __future__ import annotations

import logging
import socket
import struct
import time
from typing import Any, Callable, TypeVar

from kafka.errors import KafkaError, KafkaTimeoutError

from undertow.streams import kafka_fixes  # noqa: F401  mends kafka-python's consumer before any is made
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
    wrong password, a wrong protocol and a down broker look alike: a probe tells them apart. Where no
    broker answers (one restarting: a single-broker cluster's outage), wait for one, saying so, up to
    `settings.outage_wait_s`; where one answers and refused us twice, fail naming the settings.
    """
    since = time.monotonic()
    refusals = 0

    def for_a_broker(e: Exception) -> bool:
        # A broker that came back while kafka-python backed off (its reconnect backoff grows to 30 s)
        # answers now although the attempt timed out: one answering broker's timeout is tried again.
        nonlocal refusals
        if not isinstance(e, KafkaTimeoutError):
            return False
        if not answering(settings.hosts):
            return True
        refusals += 1
        return refusals < 2

    try:
        return _waited_out(settings, lambda: client(*args, **settings.kafka_python(), **kw), for_a_broker,
                           lambda e: f"no broker answered at {settings.bootstrap_servers} in time; waiting for one")
    except KafkaTimeoutError as e:
        who = (f" as SASL user {settings.sasl_username!r}" if settings.sasl else
               f" with the certificate {settings.ssl_certfile}" if settings.ssl_certfile else "")
        raise KafkaUnreachable(
            f"kafka: no broker at {settings.bootstrap_servers} accepted a {settings.security_protocol} "
            f"connection{who} ({e}; waited {time.monotonic() - since:.0f} s); check bootstrap_servers, "
            f"security_protocol and the credentials") from None


# An ApiVersions v0 request (api key 18, correlation id 1): every listener answers it, or closes on
# it (TLS, a refused login), before any authentication.
_CLIENT = b"undertow-probe"
PROBE = struct.pack(">ihhih", 10 + len(_CLIENT), 18, 0, 1, len(_CLIENT)) + _CLIENT


def answering(hosts: list[str], timeout_s: float = 3.0) -> bool:
    """Whether any of `hosts` (host:port) answers a Kafka request, with bytes or by closing.

    A listening port is not enough: a listener that accepts and then says nothing (a broker still
    starting or wedged; the kernel accepts for it) is no answer, and no refusal either."""
    for host in hosts:
        name, _, port = host.rpartition(":")
        try:
            with socket.create_connection((name.strip("[]"), int(port)), timeout=timeout_s) as conn:
                conn.sendall(PROBE)
                conn.recv(1)  # bytes, or b"" for a close: either is an answer
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True  # closed on us: it is up, and refused
        except (OSError, ValueError):
            continue  # nothing listens, or it listens and says nothing (socket.timeout is an OSError)
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
