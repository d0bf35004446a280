"""Least privilege on the log, as rules: each component's principal may do what it needs and nothing
the table below refuses (`undertow acls`, infra/run/access.py). The broker's own enforcement of the
same rules is checked against a broker with the authorizer on."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from undertow.infra.cli import app
from undertow.infra.run.access import run_acls, strimzi_users
from undertow.streams.access import Acl, acls, allowed, needs
from tests.helpers import write_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOYED = ROOT / "infra" / "deploy" / "run.yaml"

# (component, resource, name, operation): what each must be able to do in namespace `lab`
MAY = [
    ("feeder", "topic", "lab.tasks", "Write"), ("feeder", "topic", "lab.task-stats", "Read"),
    ("feeder", "group", "lab.rollout", "Describe"),
    ("rollout", "topic", "lab.tasks", "Read"), ("rollout", "group", "lab.rollout", "Read"),
    ("rollout", "topic", "lab.weights", "Read"), ("rollout", "topic", "lab.experiences.raw", "Write"),
    ("rollout", "topic", "lab.experiences.rejected", "Write"), ("rollout", "topic", "lab.metrics", "Write"),
    ("processors", "topic", "lab.experiences.raw", "Read"), ("processors", "group", "lab-processors", "Read"),
    ("processors", "topic", "lab.experiences.ready", "Write"), ("processors", "topic", "lab.task-stats", "Write"),
    ("processors", "topic", "lab-processors-groups-changelog", "Create"),
    ("processors", "topic", "lab-processors-dedupe-changelog", "Write"),
    ("processors", "topic", "lab-processors-__assignor-__leader", "Read"),
    ("trainer", "topic", "lab.experiences.ready", "Read"), ("trainer", "topic", "lab.experiences.expert", "Read"),
    ("trainer", "group", "undertow-trainer", "Read"), ("trainer", "topic", "lab.weights", "Write"),
    ("eval", "topic", "lab.weights", "Read"), ("eval", "topic", "lab.evals", "Write"),
    ("archive", "topic", "lab.experiences.raw", "Read"), ("archive", "group", "undertow-archive", "Read"),
    ("monitor", "topic", "lab.metrics", "Read"), ("monitor", "group", "lab-monitor", "Read"),
    ("monitor", "group", "undertow-trainer", "Describe"), ("monitor", "topic", "lab.tasks", "Describe"),
    ("serve", "topic", "lab.experiences.raw", "Write"), ("serve", "topic", "lab.weights", "Read"),
    ("operator", "topic", "lab.experiences.ready", "Create"), ("operator", "topic", "lab.tasks", "Alter"),
    ("operator", "topic", "lab-processors-groups-changelog", "Alter"), ("operator", "group", "lab.rollout", "Describe"),
]

# what each must NOT be able to do: the rollout hosts run untrusted tool code and agent programs
MAY_NOT = [
    ("rollout", "topic", "lab.experiences.ready", "Write"), ("rollout", "topic", "lab.weights", "Write"),
    ("rollout", "group", "undertow-trainer", "Read"), ("rollout", "group", "lab-processors", "Read"),
    ("rollout", "topic", "other.tasks", "Read"), ("rollout", "topic", "lab.experiences.ready", "Read"),
    ("rollout", "topic", "lab.tasks", "Write"), ("rollout", "topic", "lab.evals", "Write"),
    ("serve", "topic", "lab.experiences.ready", "Write"), ("serve", "topic", "lab.weights", "Write"),
    ("processors", "topic", "lab.weights", "Write"), ("processors", "topic", "lab.tasks", "Read"),
    ("processors", "topic", "lab.experiences.raw", "Write"),
    ("feeder", "topic", "lab.experiences.raw", "Write"), ("feeder", "group", "lab.rollout", "Read"),
    ("eval", "topic", "lab.weights", "Write"), ("trainer", "topic", "lab.experiences.ready", "Write"),
    ("archive", "topic", "lab.weights", "Read"), ("archive", "topic", "lab.metrics", "Write"),
    ("monitor", "topic", "lab.experiences.ready", "Read"), ("monitor", "group", "undertow-trainer", "Read"),
    ("operator", "topic", "other.tasks", "Create"), ("operator", "group", "undertow-trainer", "Read"),
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    path = write_config(tmp_path_factory.mktemp("acls") / "run.yaml", "lab")
    return run_acls(str(path))


def may(rules: dict[str, list[Acl]], component: str, resource: str, name: str, operation: str) -> bool:
    principal = f"User:lab-{component}"
    return allowed(rules[principal], principal, resource, name, operation)


@pytest.mark.parametrize("component, resource, name, operation", MAY)
def test_each_component_may_do_what_it_needs(lab, component, resource, name, operation):
    assert may(lab, component, resource, name, operation)


@pytest.mark.parametrize("component, resource, name, operation", MAY_NOT)
def test_and_nothing_it_must_not(lab, component, resource, name, operation):
    assert not may(lab, component, resource, name, operation)


def test_no_principal_holds_anything_on_the_cluster_or_a_wildcard(lab):
    rules = [r for principal_rules in lab.values() for r in principal_rules]
    assert {r.resource for r in rules} == {"topic", "group"}
    assert not [r for r in rules if r.name in ("*", "") or (r.pattern == "prefixed" and "." not in r.name
                                                              and not r.name.endswith("-processors-"))]


def test_kafkas_implications_read_and_write_describe_but_create_does_not():
    rules = acls("User:a", needs(reads=["t"], owns=["p-"]))
    assert allowed(rules, "User:a", "topic", "t", "Describe")
    assert not allowed(rules, "User:a", "topic", "t", "Write")
    assert allowed(rules, "User:a", "topic", "p-changelog", "Describe")  # owns: Read and Write too
    assert not allowed(acls("User:a", needs(administers=[])), "User:a", "topic", "t", "Describe")
    assert allowed([Acl("User:a", "topic", "literal", "t", "Create")], "User:a", "topic", "t", "Create")
    assert not allowed([Acl("User:a", "topic", "literal", "t", "Create")], "User:a", "topic", "t", "Describe")
    assert not allowed(rules, "User:b", "topic", "t", "Read")  # another principal's grant


def test_a_staged_run_grants_each_stage_and_a_shadow_its_own_topics(tmp_path):
    stages = [{"name": "sft", "steps": 1}, {"name": "rl", "steps": 1}]
    path = write_config(tmp_path / "run.yaml", "lab", run={"stages": stages},
                        shadows=[{"name": "gspo", "trainer": {"algorithm": {"policy_loss": "gspo"}}}],
                        watchers=["stale_fraction"])
    rules = run_acls(str(path))
    for stage in ("lab-sft", "lab-rl"):
        assert may(rules, "rollout", "topic", f"{stage}.tasks", "Read")
        assert may(rules, "shadow-gspo", "topic", f"{stage}.shadow-gspo.weights", "Write")
        assert not may(rules, "shadow-gspo", "topic", f"{stage}.weights", "Write")  # it steers no rollout
        assert may(rules, "shadow-gspo", "group", "undertow-trainer.shadow-gspo", "Read")
        assert may(rules, "watchers", "group", f"{stage}.watcher.stale_fraction", "Read")
        assert may(rules, "watchers", "topic", f"{stage}.experiences.ready", "Read")
    assert not may(rules, "rollout", "topic", "lab.tasks", "Read")  # no stage is "lab"


def test_undertow_acls_prints_each_principal_and_strimzi_users_carry_the_same_rules(tmp_path):
    path = write_config(tmp_path / "run.yaml", "lab")
    out = CliRunner().invoke(app, ["acls", str(path)])
    assert out.exit_code == 0, out.output
    assert "User:lab-rollout" in out.output and "Write           topic  literal   lab.experiences.raw" in out.output
    assert manifest_rules(yaml.safe_load_all(CliRunner().invoke(app, ["acls", str(path), "--strimzi"]).output)) == \
        {p: sorted(r) for p, r in run_acls(str(path)).items()}


def test_quotas_go_to_their_components_user_and_into_its_kafka_user(tmp_path):
    path = write_config(tmp_path / "run.yaml", "lab", access={"quotas": {"rollout": {"produce_bytes_per_s": 1.5e6},
                                                                         "eval": {"fetch_bytes_per_s": 2e7}}})
    users = {u["metadata"]["name"]: u["spec"] for u in strimzi_users(str(path), "undertow", "undertow")}
    assert users["lab-rollout"]["quotas"] == {"producerByteRate": 1500000}
    assert users["lab-eval"]["quotas"] == {"consumerByteRate": 20000000}
    assert "quotas" not in users["lab-trainer"]
    bad = write_config(tmp_path / "bad.yaml", "lab", access={"quotas": {"rollouts": {"produce_bytes_per_s": 1}}})
    out = CliRunner().invoke(app, ["config", "check", str(bad)])
    assert out.exit_code != 0 and "'rollouts' is not a component" in " ".join(out.output.split())


def test_certificate_logins_make_kafka_users_the_user_operator_issues_certificates_for(tmp_path):
    path = write_config(tmp_path / "run.yaml", "lab", access={"per_component": True, "login": "certificate"})
    users = list(strimzi_users(str(path), "undertow", "undertow"))
    assert users and all(u["spec"]["authentication"] == {"type": "tls"} for u in users)  # the CRD's client-certificate type
    assert {f"User:{u['metadata']['name']}" for u in users} == set(run_acls(str(path)))


def test_each_child_undertow_run_starts_logs_in_as_its_component():
    from undertow.infra.run.access import component_of, stage_needs
    from undertow.infra.run.config import PRINCIPALS, RunConfig
    from undertow.infra.run.supervisor import ROLES

    named = {component_of(r) for r in ROLES}
    assert named <= set(PRINCIPALS) and component_of("trainer@gspo") == component_of("eval@gspo") == "shadow-gspo"
    cfg = RunConfig(namespace="lab", watchers=["stale_fraction"], shadows=[{"name": "gspo"}])
    assert named | {"shadow-gspo"} <= set(stage_needs(cfg))  # each has its grants, so its login
    assert set(stage_needs(cfg)) - {"shadow-gspo"} == set(PRINCIPALS)


def test_the_deployments_kafka_users_carry_what_undertow_acls_prints():
    """infra/deploy/k8s/users.yaml is `undertow acls infra/deploy/run.yaml --strimzi`: regenerate it when
    a component's needs change."""
    shipped = yaml.safe_load_all((ROOT / "infra" / "deploy" / "k8s" / "users.yaml").read_text())
    assert manifest_rules(shipped) == {p: sorted(r) for p, r in run_acls(str(DEPLOYED)).items()}
    assert list(yaml.safe_load_all((ROOT / "infra" / "deploy" / "k8s" / "users.yaml").read_text())) == \
        list(strimzi_users(str(DEPLOYED), "undertow", "undertow"))


# The values Strimzi's KafkaUser CRD (v1, packaging/install/cluster-operator/044-Crd-kafkauser.yaml) allows:
# kubeconform cannot check users.yaml (tests/infra/test_deploy.py), so these fields are checked here.
KAFKA_USER = {"resource": {"topic", "group", "cluster", "transactionalId"}, "patternType": {"literal", "prefix"},
              "operations": {"Read", "Write", "Create", "Delete", "Alter", "Describe", "ClusterAction", "AlterConfigs",
                             "DescribeConfigs", "IdempotentWrite", "All"}}


def manifest_rules(documents) -> dict[str, list[Acl]]:
    """principal → its ACLs, read back from KafkaUser manifests whose fields Strimzi's CRD accepts."""
    out = {}
    for doc in documents:
        if not doc:
            continue
        assert doc["apiVersion"] == "kafka.strimzi.io/v1" and doc["kind"] == "KafkaUser"
        spec = doc["spec"]
        assert set(doc) == {"apiVersion", "kind", "metadata", "spec"} and set(spec) == {"authentication", "authorization"}
        assert spec["authentication"] == {"type": "scram-sha-512"}
        assert set(spec["authorization"]) == {"type", "acls"} and spec["authorization"]["type"] == "simple"
        for rule in spec["authorization"]["acls"]:
            assert set(rule) == {"resource", "operations", "host"}
            assert set(rule["resource"]) == {"type", "name", "patternType"}
            assert rule["resource"]["type"] in KAFKA_USER["resource"]
            assert rule["resource"]["patternType"] in KAFKA_USER["patternType"]
            assert set(rule["operations"]) <= KAFKA_USER["operations"]
        principal = f"User:{doc['metadata']['name']}"
        out[principal] = sorted(
            Acl(principal, rule["resource"]["type"], "literal" if rule["resource"]["patternType"] == "literal"
                else "prefixed", rule["resource"]["name"], op)
            for rule in doc["spec"]["authorization"]["acls"] for op in rule["operations"])
    return out
