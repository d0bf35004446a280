"""Session-wide fixtures: one real Apache Kafka broker for every integration test."""

from __future__ import annotations

import os
import uuid

import pytest

from undertow.infra.broker import LocalKafka, free_port_block
from undertow.streams import BOOTSTRAP_ENV, KafkaSettings, create_topics

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory):
    """Settings for a real broker: $UNDERTOW_BOOTSTRAP if set, else a KRaft node started here."""
    if os.environ.get(BOOTSTRAP_ENV):
        yield KafkaSettings().with_env()
        return
    broker = LocalKafka(tmp_path_factory.mktemp("kafka"), port=free_port_block(2)).start()
    os.environ[BOOTSTRAP_ENV] = broker.bootstrap_servers  # subprocesses (CLI, Faust workers) find it too
    try:
        yield KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
    finally:
        os.environ.pop(BOOTSTRAP_ENV, None)
        broker.stop()


@pytest.fixture
def namespace(kafka: KafkaSettings, request: pytest.FixtureRequest) -> str:
    """A fresh namespace with the whole topic catalog created, one per test."""
    ns = f"t-{request.node.name[:40].replace('[', '-').replace(']', '')}-{uuid.uuid4().hex[:6]}"
    ns = "".join(c if c.isalnum() or c in "-_" else "-" for c in ns)
    create_topics(kafka, ns)
    return ns
