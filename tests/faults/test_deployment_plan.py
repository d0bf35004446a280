"""The network tests' hosts are the deployment's (tests/faults/deployment.py reads infra/deploy/)."""

from __future__ import annotations

from pathlib import Path

from tests.faults.deployment import broker_settings, plan, replicas


def test_the_hosts_are_the_deployments_services_with_their_commands():
    brokers, settings, services = plan(Path("/run/rl.yaml"))
    assert brokers == ["kafka-1", "kafka-2", "kafka-3"]
    hosts = [s.host for s in services if s.service != "monitor"]
    assert hosts == ["feeder", "processors-1", "processors-2", "trainer-0", "trainer-1", "rollout-1", "rollout-2", "eval"]
    assert len(brokers) + len(hosts) == 11  # the topology
    commands = {s.host: s.argv for s in services}
    assert commands["rollout-2"] == ["rollout", "/run/rl.yaml"] and commands["processors-1"] == ["process", "/run/rl.yaml"]
    node = commands["trainer-1"]  # infra/deploy/k8s/trainer.yaml's torchrun, node rank 1, on the config
    assert node[0] == "torchrun" and node[node.index("--nnodes") + 1] == "2" and node[node.index("--node-rank") + 1] == "1"
    assert node[-2:] == ["train", "/run/rl.yaml"]
    assert all(s.env == {"UNDERTOW_BOOTSTRAP": "kafka-1:9092,kafka-2:9092,kafka-3:9092"} for s in services)
    assert settings["offsets.topic.replication.factor"] == "3" and settings["message.max.bytes"] == "20971520"


def test_replicas_and_broker_settings_read_as_compose_means_them():
    assert replicas({"deploy": {"replicas": "${ROLLOUT_WORKERS:-2}"}}) == 2
    assert replicas({"deploy": {"replicas": 3}}) == 3 and replicas({}) == 1
    env = {"KAFKA_NODE_ID": "1", "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "2", "OTHER": "x"}
    assert broker_settings({"environment": env}) == {"transaction.state.log.min.isr": "2"}  # the node id is placement's
