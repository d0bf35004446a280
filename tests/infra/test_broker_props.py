"""What the launcher writes for Kafka, checked without starting a JVM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from undertow.infra.broker.local import LocalKafka, _cluster_id
from tests.helpers import wait_for


def props(local: LocalKafka, node_id: int) -> dict[str, str]:
    text = local._properties(local._node(node_id))
    return dict(line.split("=", 1) for line in text.splitlines())


def test_three_nodes_form_one_quorum_with_two_in_sync_replicas(tmp_path):
    local = LocalKafka(tmp_path, port=30000, nodes=3)
    assert local.bootstrap_servers == "127.0.0.1:30000,127.0.0.1:30002,127.0.0.1:30004"
    p2 = props(local, 2)
    assert p2["controller.quorum.voters"] == "1@127.0.0.1:30001,2@127.0.0.1:30003,3@127.0.0.1:30005"
    assert p2["listeners"] == "PLAINTEXT://127.0.0.1:30002,CONTROLLER://127.0.0.1:30003"
    assert (p2["default.replication.factor"], p2["min.insync.replicas"]) == ("3", "2")
    assert p2["offsets.topic.replication.factor"] == "3" and p2["unclean.leader.election.enable"] == "false"


def test_single_node_needs_no_replicas(tmp_path):
    p = props(LocalKafka(tmp_path, port=30100), 1)
    assert (p["default.replication.factor"], p["min.insync.replicas"], p["process.roles"]) == ("1", "1", "broker,controller")
    assert p["auto.create.topics.enable"] == "false"


def test_only_one_or_three_nodes(tmp_path):
    with pytest.raises(ValueError, match="nodes: expected 1 or 3"):
        LocalKafka(tmp_path, nodes=2)


def test_unknown_node_is_named(tmp_path):
    with pytest.raises(ValueError, match="no node 7"):
        LocalKafka(tmp_path).stop_node(7)


def test_cluster_ids_never_look_like_a_flag():
    ids = [_cluster_id() for _ in range(2000)]
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)



def test_a_node_is_alive_only_as_its_own_jvm_not_as_another_clusters(tmp_path):
    """A node that died leaves its pid in the state file; if the kernel gives that pid to a node of
    another cluster, stop() must not take it for its own (a test's broker was killed so)."""
    mine, theirs = LocalKafka(tmp_path / "mine", port=30200), LocalKafka(tmp_path / "theirs", port=30300)
    their_props = theirs._node_dir(theirs._node(1)) / "server.properties"
    # A process whose command line ends as their node's does: `... kafka.Kafka <its server.properties>`.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "kafka.Kafka", str(their_props)])
    try:
        wait_for(lambda: b"kafka.Kafka" in Path(f"/proc/{stranger.pid}/cmdline").read_bytes(), what="the stranger up")
        mine._node(1).pid = theirs._node(1).pid = stranger.pid
        assert theirs.running_nodes() == [1]  # their own node, by its command line
        assert mine.running_nodes() == []
        mine.stop()
        assert stranger.poll() is None  # not signalled
    finally:
        stranger.kill()
        stranger.wait()
