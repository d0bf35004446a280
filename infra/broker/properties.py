"""A local KRaft cluster's layout (its nodes, logins, TLS and ACL choices) and each node's server.properties
rendered from it (infra/broker/local.py starts and stops the nodes)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from undertow.infra.broker.certificates import KEYSTORE_PASSWORD

TLS_DIR = "tls"
OPERATOR = "operator"  # with client_certificates: the super user the broker's own settings() log in as
# A client certificate's subject is CN=<name>: its principal is User:<name>, as a SCRAM login's is.
PRINCIPAL_FROM_CN = "RULE:^CN=([^,]+)$/$1/,DEFAULT"
CA_FILE = "ca.pem"  # in the TLS directory: the CA that signed the brokers' certificate


@dataclass
class Node:
    """One KRaft node: a broker listener and a controller listener on its host (loopback, or an address
    in a network namespace it runs in: tests/faults/network.py)."""

    node_id: int
    port: int
    controller_port: int
    pid: int | None = None
    host: str = "127.0.0.1"
    netns: str | None = None


@dataclass
class ClusterState:
    cluster_id: str
    nodes: list[Node]
    kafka_version: str
    extra: dict[str, str] = field(default_factory=dict)
    sasl_users: dict[str, str] = field(default_factory=dict)  # user -> password; empty: no login
    tls: bool = False  # the client listener speaks TLS (certificates in <data>/tls)
    acls: bool = False  # the broker authorizes every request by its ACLs; the first SASL user is a super user
    client_certificates: bool = False  # TLS, and every client shows a certificate of <data>/tls/clients-ca


def listener(state: ClusterState) -> str:
    """The client listener's name, which is also its security protocol."""
    return ("SASL_" if state.sasl_users else "") + ("SSL" if state.tls else "PLAINTEXT")


def replication_factor(state: ClusterState) -> int:
    return min(3, len(state.nodes))


def server_properties(state: ClusterState, node: Node, log_dir: Path, tls_dir: Path) -> str:
    """Node `node`'s server.properties: KRaft combined roles, the catalog's rules, and the login, TLS and
    ACL sections the cluster was made with (then `state.extra`, which wins)."""
    n, rf, name = len(state.nodes), replication_factor(state), listener(state)
    voters = ",".join(f"{x.node_id}@{x.host}:{x.controller_port}" for x in state.nodes)
    props = {
        "process.roles": "broker,controller",
        "node.id": node.node_id,
        "controller.quorum.voters": voters,
        "listeners": f"{name}://{node.host}:{node.port},CONTROLLER://{node.host}:{node.controller_port}",
        "advertised.listeners": f"{name}://{node.host}:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": name,
        "listener.security.protocol.map": f"{name}:{name},CONTROLLER:PLAINTEXT",
        "log.dirs": log_dir,
        "default.replication.factor": rf,
        "min.insync.replicas": 2 if n >= 3 else 1,
        "offsets.topic.replication.factor": rf,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": 2 if n >= 3 else 1,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": 2 if n >= 3 else 1,
        "unclean.leader.election.enable": "false",
        # Topics come from the catalog (streams/topics.py); a typo must fail, not create a topic.
        "auto.create.topics.enable": "false",
        # Tests and the local loop start many fresh consumer groups; the default 3 s delay adds up.
        "group.initial.rebalance.delay.ms": 0,
        # Weight chunks and long multi-turn experiences are larger than Kafka's 1 MB default.
        "message.max.bytes": 20 << 20,
        "replica.fetch.max.bytes": 20 << 20,
        "num.network.threads": 2,
        "num.io.threads": 4,
        "num.partitions": 1,
        "offsets.topic.num.partitions": 8,
        **_sasl_properties(state),
        **_tls_properties(state, tls_dir),
        **_acl_properties(state),
        **state.extra,
    }
    return "".join(f"{k}={v}\n" for k, v in props.items())



def _sasl_properties(state: ClusterState) -> dict[str, str]:
    """PLAIN accounts on the client listener; brokers replicate over it logged in as the first user.
    SCRAM-SHA-512 too, for the users the admin API creates (`undertow run` makes one per component)."""
    if not state.sasl_users:
        return {}
    user, password = next(iter(state.sasl_users.items()))
    accounts = " ".join(f'user_{u}="{p}"' for u, p in state.sasl_users.items())
    prefix = f"listener.name.{listener(state).lower()}"
    return {
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "sasl.mechanism.inter.broker.protocol": "PLAIN",
        f"{prefix}.plain.sasl.jaas.config":
            "org.apache.kafka.common.security.plain.PlainLoginModule required "
            f'username="{user}" password="{password}" {accounts};',
        f"{prefix}.scram-sha-512.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
    }



def _acl_properties(state: ClusterState) -> dict[str, str]:
    """KRaft's authorizer, denying what no ACL allows. Super users: the first SASL user (brokers
    replicate as it; it creates topics and ACLs), or with certificates the operator and the brokers
    (their certificate's CN, localhost: certificates.py); and ANONYMOUS, which is how nodes reach the
    controller listener (PLAINTEXT, on loopback only)."""
    if not state.acls:
        return {}
    supers = [OPERATOR, "localhost"] if state.client_certificates else [next(iter(state.sasl_users))]
    return {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": ";".join(f"User:{u}" for u in [*supers, "ANONYMOUS"])}



def _tls_properties(state: ClusterState, tls: Path) -> dict[str, str]:
    """The broker's key and certificate; the CA is trusted too, since brokers replicate over TLS."""
    if not state.tls:
        return {}
    props = {
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(tls / "broker.p12"),
        "ssl.keystore.password": KEYSTORE_PASSWORD,
        "ssl.key.password": KEYSTORE_PASSWORD,
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls / CA_FILE),
    }
    if state.client_certificates:
        props.update({"ssl.truststore.location": str(tls / "truststore.pem"), "ssl.client.auth": "required",
                      "ssl.principal.mapping.rules": PRINCIPAL_FROM_CN})
    return props


def check_sasl_users(users: dict[str, str]) -> None:
    """Names and passwords go into a JAAS line inside a properties file: keep them free of its syntax."""
    for user, password in users.items():
        if not re.fullmatch(r"[A-Za-z0-9._-]+", user):
            raise ValueError(f"sasl_users: user name {user!r} may hold only letters, digits, '.', '_' and '-'")
        if not password or re.search(r'["\\\s]', password):
            raise ValueError(f"sasl_users: password of {user!r} must be non-empty, without quotes, "
                             "backslashes or whitespace")
