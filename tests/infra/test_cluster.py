"""The 3-node KRaft cluster keeps serving with one broker down: no acknowledged record is lost."""

from __future__ import annotations

from pathlib import Path

import pytest

from undertow.infra.broker.local import LocalKafka, free_port_block
from undertow.streams import KafkaSettings, Topics, create_topics, describe_topics
from tests.helpers import Sending

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

    with Sending(kafka, topics.tasks) as sends:
        sends.more(50, "before the crash")
        cluster.stop_node(2, kill=True)
        assert cluster.running_nodes() == [1, 3]
        sends.more(50, "with node 2 down")  # acks=all still succeeds with 2 of 3 in sync
        cluster.start_node(2)
        sends.more(50, "with node 2 back")
    sends.check_read_back(kafka)
    assert cluster.running_nodes() == [1, 2, 3]


def test_a_cluster_stops_node_by_node_while_a_quorum_is_left_and_kills_the_last(cluster):
    """SIGTERMed together, the three nodes each waited for a controller quorum none of them still had,
    until the stop's timeout (a minute) killed them all. One at a time, the first two shut down cleanly."""
    assert cluster.running_nodes() == [1, 2, 3]
    pids = {n.node_id: n.pid for n in cluster.state.nodes}
    assert all(b"-XX:TieredStopAtLevel=1" in Path(f"/proc/{pid}/cmdline").read_bytes() for pid in pids.values())  # $KAFKA_OPTS
    cluster.stop()
    assert cluster.running_nodes() == []
    clean = {n.node_id: f"Request Handler on Controller {n.node_id}] shut down completely"
             in (cluster._node_dir(n) / "server.log").read_text() for n in cluster.state.nodes}
    assert clean == {1: False, 2: True, 3: True}  # the last, alone, would have waited out the timeout
