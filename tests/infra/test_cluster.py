"""The 3-node KRaft cluster keeps serving with one broker down: no acknowledged record is lost."""

from __future__ import annotations

import threading

import pytest

from undertow.infra.broker.local import LocalKafka, free_port_block
from undertow.schemas import Task
from undertow.streams import KafkaSettings, RecordConsumer, RecordProducer, Topics, create_topics, describe_topics
from tests.helpers import wait_for

pytestmark = [pytest.mark.broker, pytest.mark.cluster, pytest.mark.slow]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalKafka(tmp_path_factory.mktemp("cluster"), port=free_port_block(6), nodes=3, heap="384m").start()
    yield local
    local.stop()


def test_cluster_survives_a_broker_crash(cluster):
    kafka = KafkaSettings(bootstrap_servers=cluster.bootstrap_servers)
    topics = Topics("fault")
    create_topics(kafka, "fault")
    info = {t.name: t for t in describe_topics(kafka, [topics.tasks])}[topics.tasks]
    assert info.replication_factor == 3 and info.configs["min.insync.replicas"] == "2"

    acked: list[str] = []
    failed: list[str] = []
    stop = threading.Event()

    def produce() -> None:
        with RecordProducer(kafka, request_timeout_ms=10000) as p:
            i = 0
            while not stop.is_set():
                tid = f"t{i}"
                try:
                    p.send(topics.tasks, Task(task_id=tid, prompt="2+2"), key=tid).get(timeout=60)
                    acked.append(tid)
                except Exception:  # noqa: BLE001 — an unacknowledged send may be lost; that is allowed
                    failed.append(tid)
                i += 1

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    try:
        progress = lambda: f"{len(acked)} acknowledged, {len(failed)} failed; nodes up {cluster.running_nodes()}"
        wait_for(lambda: len(acked) >= 50, 90, "50 acknowledged sends", state=progress, every=0.05)
        cluster.stop_node(2, kill=True)
        assert cluster.running_nodes() == [1, 3]
        during = len(acked)
        # acks=all still succeeds with 2 of 3 in sync
        wait_for(lambda: len(acked) >= during + 50, 90, "50 more with node 2 down", state=progress, every=0.05)
        cluster.start_node(2)
        wait_for(lambda: len(acked) >= during + 100, 90, "50 more with node 2 back", state=progress, every=0.05)
    finally:
        stop.set()
        writer.join(120)

    with RecordConsumer(kafka, [topics.tasks], group_id=None, expect=Task, rejected_topic=topics.rejected) as c:
        delivered: list[str] = []
        wait_for(lambda: delivered.extend(d.record.task_id for d in c.poll(timeout_ms=500)) or set(acked) <= set(delivered),
                 60, "every acknowledged send read back", every=0,
                 state=lambda: f"{len(set(acked) - set(delivered))} of {len(acked)} acknowledged not read yet")
        delivered += [d.record.task_id for d in c.poll(timeout_ms=2000)]
    seen = set(delivered)
    assert set(acked) <= seen, f"lost {len(set(acked) - seen)} acknowledged records"
    assert len(delivered) == len(seen), "the idempotent producer wrote a record twice"
    assert len(seen) == len(seen & (set(acked) | set(failed)))  # nothing that was never sent
    assert cluster.running_nodes() == [1, 2, 3]
