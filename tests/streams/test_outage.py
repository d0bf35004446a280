"""A broker that is down (nothing answers) is waited for, saying so; one that answers and refuses us
fails after one more try (a wrong password must not look like an outage). The broker-down run itself
is the CI chaos soak (tests/faults/test_chaos_soak.py: a single broker down for 120 s)."""

from __future__ import annotations

import importlib
import logging
import socket
import threading
import time

import pytest
from kafka import KafkaProducer
from kafka.errors import CommitFailedError, KafkaConnectionError, KafkaTimeoutError

from undertow.streams import KafkaSettings, KafkaUnreachable
from undertow.streams.connect import answering, connect, outlast

connect_module = importlib.import_module("undertow.streams.connect")  # the package's `connect` is the function


@pytest.fixture
def quick_retries(monkeypatch):
    monkeypatch.setattr(connect_module, "RETRY_S", 0.2)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again: nothing listens there


def test_no_broker_listening_is_waited_for_then_refused_with_how_long(quick_retries, caplog):
    settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{closed_port()}", outage_wait_s=2.0)
    t0 = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="undertow.streams.connect"):
        with pytest.raises(KafkaUnreachable, match=r"waited \d+ s"):
            connect(KafkaProducer, settings, bootstrap_timeout_ms=300)
    assert 1.5 < time.monotonic() - t0 < 10
    assert any("no broker answered at" in r.message and "waiting for one" in r.message for r in caplog.records)


def test_a_broker_that_answers_and_refuses_fails_at_once(quick_retries, caplog):
    """A listener that closes every connection it accepts (as a broker refusing a login looks to
    kafka-python): tried once more (it may have come back during the first attempt), then refused."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        threading.Thread(target=close_each_connection, args=(server,), daemon=True).start()
        settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{server.getsockname()[1]}", outage_wait_s=60.0)
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="undertow.streams.connect"):
            with pytest.raises(KafkaUnreachable, match="accepted a PLAINTEXT connection"):
                connect(KafkaProducer, settings, bootstrap_timeout_ms=500)
    assert time.monotonic() - t0 < 10 and len([r for r in caplog.records if r.name == "undertow.streams.connect"]) == 1


def test_a_listener_that_says_nothing_is_waited_for(quick_retries, caplog):
    """A port that accepts (the kernel does) where nobody reads, as a broker still starting or wedged:
    no answer, so no refusal either."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)  # never accepted, never read
        settings = KafkaSettings(bootstrap_servers=f"127.0.0.1:{server.getsockname()[1]}", outage_wait_s=4.0)
        t0 = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="undertow.streams.connect"):
            with pytest.raises(KafkaUnreachable, match=r"waited \d+ s"):
                connect(KafkaProducer, settings, bootstrap_timeout_ms=300)
    assert time.monotonic() - t0 > 3.5
    assert any("no broker answered at" in r.message for r in caplog.records)


@pytest.mark.broker
def test_a_broker_back_before_kafka_python_retried_is_tried_again(kafka, quick_retries):
    """kafka-python's reconnect backoff grows to 30 s, its bootstrap times out at 30 s: an attempt
    begun during an outage can time out with the broker back and answering (the CI soak's crash)."""
    assert answering(kafka.hosts)
    attempts = []

    def back_too_late(**kw):
        attempts.append(1)
        if len(attempts) == 1:
            raise KafkaTimeoutError("Unable to bootstrap")
        return KafkaProducer(**kw)

    producer = connect(back_too_late, kafka)
    producer.close()
    assert len(attempts) == 2


def close_each_connection(server: socket.socket) -> None:
    while True:
        try:
            conn, _ = server.accept()
        except OSError:
            return  # the test closed the server
        conn.recv(64)
        conn.close()


def test_a_call_that_fails_for_want_of_a_broker_is_called_again_and_logged(quick_retries, caplog):
    failures = [KafkaConnectionError("111 ECONNREFUSED")] * 2

    def commit() -> str:
        if failures:
            raise failures.pop()
        return "committed"

    with caplog.at_level(logging.WARNING, logger="undertow.streams.connect"):
        assert outlast(KafkaSettings(bootstrap_servers="b:9092"), "a commit", commit) == "committed"
    assert sum("a commit waits for the brokers at b:9092 (KafkaConnectionError" in r.message
               for r in caplog.records) == 2


def test_a_refused_commit_is_not_retried(quick_retries):
    calls = []

    def commit() -> None:
        calls.append(1)
        raise CommitFailedError("the group rebalanced")

    with pytest.raises(CommitFailedError):
        outlast(KafkaSettings(bootstrap_servers="b:9092"), "a commit", commit)
    assert calls == [1]
