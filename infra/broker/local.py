"""A local Apache Kafka in KRaft mode: one node, or a 3-node cluster on loopback.

Every node is a combined broker + controller. The cluster's layout (ports, cluster id) is kept in
`<data>/cluster.json`, so `down` then `up` with the same data directory brings the same cluster
back with its data, and `status` / `down` work from another process. With `sasl_users` the client
listener asks for a SASL login (PLAIN for them, SCRAM-SHA-512 for users made through the admin
API); with `tls` it speaks TLS with a certificate from a CA made for this
data directory (both: SASL_SSL); with `client_certificates` it asks every client for a certificate
its clients CA signed, the principal being the certificate's CN; with `acls` (and users or client
certificates) it authorizes each request by its ACLs. The controller listener stays PLAINTEXT, on the
node's host (loopback unless `hosts` places it elsewhere).
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import asdict
from pathlib import Path

from undertow.infra.broker import kafka_dist
from undertow.infra.broker.certificates import (CLIENTS_CA, CLIENTS_DIR, issue_client_certificate,
                                                 make_certificates, make_clients_ca)
from undertow.infra.broker.properties import (CA_FILE, OPERATOR, TLS_DIR, ClusterState, Node, check_sasl_users,
                                               listener, replication_factor, server_properties)
from undertow.streams.settings import KafkaSettings

STATE_FILE = "cluster.json"


def jvm_options() -> list[str]:
    """`$KAFKA_OPTS`, as Kafka's own start scripts read it: JVM options for the nodes."""
    return shlex.split(os.environ.get("KAFKA_OPTS", ""))


def free_port_block(count: int, start: int = 20000, stop: int = 60000) -> int:
    """A base port such that base .. base+count-1 are all free on loopback."""
    for base in range(start + os.getpid() % 997 * 7, stop, count + 3):
        if all(_port_free(base + i) for i in range(count)):
            return base
    raise RuntimeError("no free block of ports on 127.0.0.1")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _alive(pid: int | None, props: Path) -> bool:
    """Whether `pid` is the Kafka node started with the properties file `props`. Not any Kafka: a
    node that died leaves its pid in the state file, and the kernel may give that pid to a node of
    another cluster, which stop() must not kill."""
    if not pid:
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return cmdline.rstrip(b"\0").split(b"\0")[-2:] == [b"kafka.Kafka", str(props).encode()]


class LocalKafka:
    """Start, stop and inspect a KRaft cluster of `nodes` nodes whose data lives in `data_dir`.

    Node i (0-based) listens on `port + 2i` (clients) and `port + 2i + 1` (controller).
    With 3 nodes topics get replication factor 3 and min.insync.replicas 2. `sasl_users` (user ->
    password) turns the client listener into SASL_PLAINTEXT with mechanism PLAIN; `tls` turns it into
    SSL (SASL_SSL with users), its certificate signed by a CA kept in `<data_dir>/tls/ca.pem`.
    `client_certificates` (TLS, no users) admits only clients with a certificate from the clients CA,
    which each cold start makes anew: what `issue` signed before a stop no longer logs in after it.
    `hosts` (each node's address and network namespace) runs the nodes on hosts of their own instead
    of loopback (tests/faults/network.py).
    """

    def __init__(self, data_dir: str | Path, port: int = 9092, nodes: int = 1, heap: str = "512m",
                 extra: dict[str, str] | None = None, sasl_users: dict[str, str] | None = None,
                 tls: bool = False, acls: bool = False, client_certificates: bool = False,
                 hosts: list[tuple[str, str | None]] | None = None):
        self.data_dir = Path(data_dir).resolve()
        self.heap = heap
        state = self._load()
        if state is None:
            if nodes not in (1, 3):
                raise ValueError(f"nodes: expected 1 or 3, got {nodes}")
            check_sasl_users(sasl_users or {})
            if client_certificates and sasl_users:
                raise ValueError("client_certificates: a client logs in by its certificate or by SASL, not both")
            if acls and not (sasl_users or client_certificates):
                raise ValueError("acls: needs sasl_users or client_certificates (without a login every client is the "
                                 "same anonymous user)")
            places = hosts or [("127.0.0.1", None)] * nodes
            if len(places) != nodes:
                raise ValueError(f"hosts: expected one (address, netns) per node ({nodes}), got {len(places)}")
            state = ClusterState(
                cluster_id=_cluster_id(),
                nodes=[Node(i + 1, port + 2 * i, port + 2 * i + 1, host=address, netns=netns)
                       for i, (address, netns) in enumerate(places)],
                kafka_version=kafka_dist.kafka_version(),
                extra=dict(extra or {}),
                sasl_users=dict(sasl_users or {}),
                tls=tls or client_certificates,
                acls=acls,
                client_certificates=client_certificates,
            )
        self.state = state

    # -- what callers read ------------------------------------------------------------------

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"{n.host}:{n.port}" for n in self.state.nodes)

    @property
    def listener(self) -> str:
        """The client listener's name, which is also its security protocol."""
        return listener(self.state)

    @property
    def ca_file(self) -> Path:
        """The PEM certificate of the CA that signed the brokers' certificate (with `tls`)."""
        return self.data_dir / TLS_DIR / CA_FILE

    def settings(self) -> KafkaSettings:
        """Client settings for this cluster; with SASL, logged in as the first user; with TLS, trusting its CA;
        with client certificates, as the operator (issued at start)."""
        kw: dict = {"bootstrap_servers": self.bootstrap_servers, "security_protocol": self.listener}
        if self.state.tls:
            kw["ssl_cafile"] = str(self.ca_file)
        if self.state.client_certificates:
            cert, key = self._client_files(OPERATOR)
            kw.update(ssl_certfile=str(cert), ssl_keyfile=str(key))
        if self.state.sasl_users:
            user, password = next(iter(self.state.sasl_users.items()))
            kw.update(sasl_mechanism="PLAIN", sasl_username=user, sasl_password=password)
        return KafkaSettings(**kw)

    def issue(self, name: str) -> tuple[Path, Path]:
        """(certificate, key) that log in as User:<name> until the next cold start (client_certificates)."""
        if not self.state.client_certificates:
            raise ValueError(f"{self.data_dir}: started without client_certificates, it takes no certificate logins")
        return issue_client_certificate(self.data_dir / TLS_DIR, name)

    def _client_files(self, name: str) -> tuple[Path, Path]:
        clients = self.data_dir / TLS_DIR / CLIENTS_DIR
        return clients / f"{name}.pem", clients / f"{name}.key"

    @property
    def replication_factor(self) -> int:
        return replication_factor(self.state)

    def running_nodes(self) -> list[int]:
        """Ids of nodes whose JVM is alive."""
        return [n.node_id for n in self.state.nodes if self._alive(n)]

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, timeout: float = 120.0) -> "LocalKafka":
        """Format storage if new, launch every node that is not running, wait until all serve."""
        cp = kafka_dist.classpath()
        if self.state.tls and not self.ca_file.exists():
            make_certificates(self.data_dir / TLS_DIR)
        if self.state.client_certificates and not self.running_nodes():
            self._new_clients_ca()
        for node in self.state.nodes:
            if not self._alive(node):
                self._launch(node, cp)
        self._save()
        self.wait_ready(timeout)
        return self

    def stop(self, timeout: float = 60.0) -> None:
        """Stop every node cleanly (SIGTERM, controlled shutdown) one at a time, SIGKILL past the timeout.
        A controlled shutdown needs a quorum of controllers: the nodes it would leave without one are
        killed (their logs are recovered at the next start), since they would wait out the timeout."""
        deadline = time.monotonic() + timeout
        for node in reversed(self.state.nodes):
            quorum = sum(self._alive(n) for n in self.state.nodes) > len(self.state.nodes) // 2
            if quorum:
                self._signal(node, signal.SIGTERM)
            self._reap(node, deadline if quorum else 0)
        self._save()

    def stop_node(self, node_id: int, kill: bool = False, timeout: float = 60.0) -> None:
        """Stop one node: SIGTERM for a clean shutdown, or SIGKILL to simulate a crash."""
        node = self._node(node_id)
        self._signal(node, signal.SIGKILL if kill else signal.SIGTERM)
        self._reap(node, time.monotonic() + timeout)
        self._save()

    def start_node(self, node_id: int, timeout: float = 120.0) -> None:
        """Bring one stopped node back and wait until the whole cluster serves again."""
        node = self._node(node_id)
        if not self._alive(node):
            self._launch(node, kafka_dist.classpath())
            self._save()
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        """Block until every running node answers metadata requests and sees all running peers."""
        from undertow.streams.admin import serving_brokers

        deadline = time.monotonic() + timeout
        want = set(self.running_nodes())
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            died = sorted(want - set(self.running_nodes()))
            if died:
                logs = "".join(self._node_dir(self._node(i)).joinpath("stdout.log").read_text()[-2000:] for i in died)
                raise RuntimeError(f"Kafka node(s) {died} exited while starting; see "
                                   f"{self.data_dir}/node-*/server.log\n{logs}")
            try:
                # A short reconnect backoff: kafka-python's grows to 30 s while the port is still closed.
                seen = serving_brokers(self.settings(), request_timeout_ms=5000, reconnect_backoff_max_ms=500)
                if want <= seen:
                    return
                last_error = RuntimeError(f"brokers registered {sorted(seen)}, waiting for {sorted(want)}")
            except Exception as e:  # noqa: BLE001 — any failure here means "not ready yet"
                last_error = e
            time.sleep(0.5)
        raise TimeoutError(f"Kafka at {self.bootstrap_servers} not ready after {timeout:.0f}s: {last_error}; "
                           f"see {self.data_dir}/node-*/server.log")

    # -- internals --------------------------------------------------------------------------

    def _node(self, node_id: int) -> Node:
        for node in self.state.nodes:
            if node.node_id == node_id:
                return node
        raise ValueError(f"node_id: no node {node_id} (have {[n.node_id for n in self.state.nodes]})")

    def _node_dir(self, node: Node) -> Path:
        return self.data_dir / f"node-{node.node_id}"

    def _alive(self, node: Node) -> bool:
        return _alive(node.pid, self._node_dir(node) / "server.properties")

    def _launch(self, node: Node, cp: str) -> None:
        ndir = self._node_dir(node)
        (ndir / "log").mkdir(parents=True, exist_ok=True)
        props = ndir / "server.properties"
        props.write_text(self._properties(node))
        if not (ndir / "log" / "meta.properties").exists():
            self._format(props, cp)
        on_host = ["ip", "netns", "exec", node.netns] if node.netns else []  # exec'd: the pid is java's
        cmd = [*on_host, kafka_dist.java(), f"-Xmx{self.heap}", "-Xms64m", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
               f"-Dlog4j2.configurationFile={kafka_dist.LOG4J_CONFIG}", f"-Dundertow.log.file={ndir / 'server.log'}",
               *jvm_options(), "-cp", cp, "kafka.Kafka", str(props)]
        with open(ndir / "stdout.log", "ab") as out:
            # A session of its own: the broker outlives `undertow broker up` and ignores the CLI's Ctrl-C.
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True)
        # Popen returns once exec has begun, but the kernel fills in /proc/<pid>/cmdline a moment
        # later; until then _alive reads the new node as dead and start() would not wait for it.
        deadline = time.monotonic() + 10
        while not _alive(proc.pid, props) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        node.pid = proc.pid

    def _format(self, props: Path, cp: str) -> None:
        proc = subprocess.run([kafka_dist.java(), "-Xmx256m", *jvm_options(), f"-Dlog4j2.configurationFile={kafka_dist.LOG4J_CONFIG}",
                               f"-Dundertow.log.file={props.parent / 'format.log'}", "-cp", cp,
                               "kafka.tools.StorageTool", "format", f"--cluster-id={self.state.cluster_id}", "-c", str(props)],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"formatting {props.parent} failed:\n{proc.stdout}{proc.stderr}")

    def _properties(self, node: Node) -> str:
        return server_properties(self.state, node, self._node_dir(node) / "log", self.data_dir / TLS_DIR)

    def _new_clients_ca(self) -> None:
        """A fresh clients CA (the rotation of every certificate login), the brokers' truststore (their own
        CA, which also lets them replicate to each other, and it) and the operator's certificate."""
        tls = self.data_dir / TLS_DIR
        make_clients_ca(tls)
        (tls / "truststore.pem").write_text(self.ca_file.read_text() + (tls / f"{CLIENTS_CA}.pem").read_text())
        self.issue(OPERATOR)

    def _signal(self, node: Node, sig: int) -> None:
        if self._alive(node):
            os.kill(node.pid, sig)

    def _reap(self, node: Node, deadline: float) -> None:
        while self._alive(node) and time.monotonic() < deadline:
            _waitpid(node.pid)
            time.sleep(0.1)
        if self._alive(node):
            os.kill(node.pid, signal.SIGKILL)
            time.sleep(0.2)
            _waitpid(node.pid)
        node.pid = None

    def _load(self) -> ClusterState | None:
        path = self.data_dir / STATE_FILE
        if not path.exists():
            return None
        raw = json.loads(path.read_text())
        return ClusterState(cluster_id=raw["cluster_id"], nodes=[Node(**n) for n in raw["nodes"]],
                            kafka_version=raw["kafka_version"], extra=raw.get("extra", {}),
                            sasl_users=raw.get("sasl_users", {}), tls=raw.get("tls", False),
                            acls=raw.get("acls", False), client_certificates=raw.get("client_certificates", False))

    def _save(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        if self.state.sasl_users or self.state.tls:  # passwords and the broker's key sit in there
            self.data_dir.chmod(0o700)
        (self.data_dir / STATE_FILE).write_text(json.dumps(asdict(self.state), indent=2))


def _waitpid(pid: int) -> None:
    """Reap our own child so it does not linger as a zombie (which /proc still shows)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def _cluster_id() -> str:
    """16 random bytes in URL-safe base64, as Kafka's own; never starting with '-' (read as a flag)."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid
