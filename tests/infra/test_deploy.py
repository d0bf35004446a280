"""The deployment files (infra/deploy/): the Compose file against the Compose specification's schema,
the Kubernetes manifests through kubeconform (-strict) against Kubernetes 1.33's schemas and the
Strimzi and KEDA CRDs, and both against the run they start (its config, topics, groups, commands).
Docker images are not built and nothing is applied to a cluster here (no daemon, no cluster)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from undertow.infra.cli import app
from undertow.infra.deploy.validate import HERE, Tools, compose_errors, crd_schemas, documents, kubeconform, \
    kubernetes_schemas
from undertow.infra.run.config import load_component_config
from undertow.rollout.config import rollout_group
from undertow.streams import Topics

TOOLS = Tools()
# users.yaml (Strimzi KafkaUsers) is checked by tests/infra/test_access.py: no registry serves Strimzi's
# KafkaUser CRD for kubeconform (the three in k8s/crds/ came from Strimzi's repository).
MANIFESTS = sorted(p for p in (HERE / "k8s").glob("*.yaml") if p.name != "users.yaml")
RUN = load_component_config(HERE / "run.yaml")


@pytest.fixture(scope="module", autouse=True)
def tools_installed():
    """CI installs the validators (infra/bootstrap.sh): one missing is a failure, never a skip."""
    assert not TOOLS.missing(), f"not installed: {TOOLS.missing()}: run `bash infra/bootstrap.sh`"


@pytest.fixture(scope="module")
def schemas(tmp_path_factory):
    root = tmp_path_factory.mktemp("schemas")
    made = crd_schemas(TOOLS.crds, root / "crds")
    kubernetes_schemas(MANIFESTS, TOOLS.kubernetes_schemas, root / "kubernetes")
    assert {p.relative_to(root / "crds").as_posix() for p in made} >= {
        "kafka.strimzi.io/kafka_v1.json", "kafka.strimzi.io/kafkatopic_v1.json",
        "kafka.strimzi.io/kafkanodepool_v1.json", "keda.sh/scaledobject_v1alpha1.json"}
    return root


def conform(paths: list[Path], schemas: Path) -> dict:
    done = kubeconform(paths, TOOLS, schemas / "kubernetes", schemas / "crds")
    return json.loads(done.stdout)


def test_manifests_conform_to_kubernetes_strimzi_and_keda(schemas):
    docs = list(documents(MANIFESTS))
    result = conform(MANIFESTS, schemas)
    assert result["summary"] == {"valid": len(docs), "invalid": 0, "errors": 0, "skipped": 0}, result["resources"]
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["ConfigMap", "Deployment", "Kafka", "KafkaNodePool", "KafkaTopic", "ScaledObject", "Service",
                     "StatefulSet"]


@pytest.mark.parametrize("kind, name, path, value", [
    ("Deployment", "rollout", ["spec", "replica"], 2),  # a misspelt field of a built-in kind
    ("ScaledObject", "rollout", ["spec", "maxReplicas"], 16),  # of KEDA's CRD
    ("KafkaTopic", "arith-tasks", ["spec", "partitions"], "16"),  # a wrong type in Strimzi's
    ("Kafka", "undertow", ["spec", "kafka", "listener"], []),
])
def test_a_broken_manifest_is_refused(schemas, tmp_path, kind, name, path, value):
    docs = [copy.deepcopy(d) for d in documents(MANIFESTS)]
    target = next(d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name)
    node = target
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump_all(docs))
    result = conform([broken], schemas)
    assert result["summary"]["invalid"] == 1 and result["summary"]["valid"] == len(docs) - 1


def test_compose_file_conforms_to_the_compose_specification(tmp_path):
    assert compose_errors(HERE / "compose.yaml", TOOLS.compose_schema) == []
    broken = yaml.safe_load((HERE / "compose.yaml").read_text())
    broken["services"]["rollout"]["deploy"]["replica"] = 3  # misspelt replicas
    (tmp_path / "compose.yaml").write_text(yaml.safe_dump(broken))
    assert [e for e in compose_errors(tmp_path / "compose.yaml", TOOLS.compose_schema) if "replica" in e]


def test_compose_runs_three_kraft_brokers_and_every_component():
    services = yaml.safe_load((HERE / "compose.yaml").read_text())["services"]
    brokers = [s for s in services.values() if "KAFKA_PROCESS_ROLES" in s.get("environment", {})]
    assert len(brokers) == 3 and {b["environment"]["KAFKA_PROCESS_ROLES"] for b in brokers} == {"broker,controller"}
    commands = {name: s["command"][0] for name, s in services.items() if s.get("image", "").startswith("undertow")}
    assert commands == {"topics": "topics", "feeder": "feed", "processors": "process", "trainer": "train",
                        "rollout": "rollout", "eval": "eval", "monitor": "monitor"}
    assert set(commands.values()) <= cli_commands()


def test_manifests_agree_with_the_run_they_start():
    docs = list(documents(MANIFESTS))
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    assert config_map["data"]["run.yaml"] == (HERE / "run.yaml").read_text()
    topics = Topics(RUN.namespace)
    declared = {d["spec"]["topicName"]: d["spec"] for d in docs if d["kind"] == "KafkaTopic"}
    rf = RUN.topics.replication
    assert declared == {name: {"topicName": name, "partitions": RUN.topics.count(spec.suffix), "replicas": rf,
                               "config": {k: int(v) if v.lstrip("-").isdigit() else v
                                          for k, v in spec.topic_configs(rf).items()}}
                        for name, spec in topics.specs().items()}
    scaled = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "ScaledObject"}
    # one worker per partition at most, each trigger on its own group's topic
    for name, group, topic, suffix in (("rollout", rollout_group(RUN.namespace), topics.tasks, "tasks"),
                                       ("processors", f"{RUN.namespace}-processors", topics.raw, "experiences.raw")):
        trigger = scaled[name]["triggers"][0]["metadata"]
        assert (trigger["consumerGroup"], trigger["topic"]) == (group, topic)
        assert scaled[name]["maxReplicaCount"] == RUN.topics.count(suffix)
    args = {d["metadata"]["name"]: d["spec"]["template"]["spec"]["containers"][0]["args"]
            for d in docs if d["kind"] in ("Deployment", "StatefulSet")}
    assert {n: a[a.index("train") if "train" in a else 0] for n, a in args.items()} == {
        "rollout": "rollout", "processors": "process", "feeder": "feed", "eval": "eval", "monitor": "monitor",
        "trainer": "train"}
    assert RUN.trainer.weights.uri.startswith("s3://")  # no shared disk between trainer and workers


def cli_commands() -> set[str]:
    import typer.main

    return set(typer.main.get_command(app).commands)
