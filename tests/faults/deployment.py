"""The deployment's topology on hosts in network namespaces (issue 48): the services of
`infra/deploy/compose.yaml`, each replica on a host of its own, and the trainer as the two nodes of
`infra/deploy/k8s/trainer.yaml` (torchrun, one rank per node, gloo over the hosts' network).

What is read from the deployment files, not restated here: which services there are, how many
replicas each runs, their commands, their environment and the brokers' settings (the `KAFKA_*`
variables). What is replaced, because this machine has neither: Docker's images (each command runs
as `python -m undertow.infra.cli` in its host's namespace) and the object store (the run's config
is the caller's; the demo's sends its weights through Kafka). Compose's `restart: on-failure` is
kept: `poll()` restarts a service that exited with an error.

    with Deployment(config, workdir) as d:   # brokers, topics, then every service on its host
        d.net.cut("rollout-1", d.brokers)     # the faults: tests/faults/network.py
        d.poll()
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from undertow.infra.broker.local import LocalKafka
from tests.faults.network import Hosts, Proxy

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "infra" / "deploy"
CONFIG_IN_IMAGE = "/etc/undertow/run.yaml"
KAFKA_PORT = 9092
# Settings LocalKafka derives from the hosts it is given (ids, listeners, voters), or that name a
# Docker volume: the rest of each broker's `KAFKA_*` environment becomes its server.properties.
PLACED = {"node.id", "process.roles", "controller.quorum.voters", "listeners", "advertised.listeners",
          "controller.listener.names", "listener.security.protocol.map", "inter.broker.listener.name", "cluster.id"}
CLI = [sys.executable, "-m", "undertow.infra.cli"]


@dataclass
class Service:
    """One replica of a deployment service, on its own host."""

    host: str
    service: str
    argv: list[str]
    env: dict[str, str]
    proc: subprocess.Popen | None = None
    restarts: int = 0
    log: Path | None = None
    exits: list[int] = field(default_factory=list)
    exited_at: float | None = None  # while it waits out its restart delay
    stopped: bool = False


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())  # anchors and `<<` merges resolved


def replicas(spec: dict) -> int:
    """A service's `deploy.replicas` (`${VAR:-2}` is its default), 1 when unset."""
    value = str(spec.get("deploy", {}).get("replicas", 1))
    default = re.fullmatch(r"\$\{\w+:-(\d+)\}", value)
    return int(default.group(1) if default else value)


def broker_settings(spec: dict) -> dict[str, str]:
    """A broker service's `KAFKA_*` environment as server.properties, less what placement decides."""
    props = {k[len("KAFKA_"):].lower().replace("_", "."): str(v) for k, v in spec["environment"].items()
             if k.startswith("KAFKA_")}
    return {k: v for k, v in props.items() if k not in PLACED}


def trainer_nodes() -> tuple[int, list[str]]:
    """The trainer StatefulSet's replica count and its container's command line (torchrun's)."""
    docs = list(yaml.safe_load_all((DEPLOY / "k8s" / "trainer.yaml").read_text()))
    (sts,) = [d for d in docs if d["kind"] == "StatefulSet"]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    return sts["spec"]["replicas"], [*container["command"], *container["args"]]


def plan(config: Path) -> tuple[list[str], dict[str, str], list[Service]]:
    """(broker hosts, their settings, the other services) as the deployment files describe them."""
    services = compose()["services"]
    brokers = [name for name, s in services.items() if str(s.get("image", "")).startswith("apache/kafka")]
    settings = broker_settings(services[brokers[0]])
    assert all(broker_settings(services[b]) == settings for b in brokers), "the brokers' settings differ"
    out: list[Service] = []
    for name, spec in services.items():
        if not str(spec.get("image", "")).startswith("undertow") or spec.get("restart") == "no":
            continue  # not ours (the object store), or a one-shot (`topics`: `Deployment` runs it first)
        env = {k: str(v) for k, v in spec.get("environment", {}).items() if not k.startswith("AWS_")}
        named = [a.rsplit(":", 1)[0] for a in env.get("UNDERTOW_BOOTSTRAP", "").split(",")]
        assert named == brokers, f"{name}'s UNDERTOW_BOOTSTRAP names {named}, the brokers are {brokers}"
        if spec["command"][0] == "train":  # the trainer's nodes: the StatefulSet's, not compose's one container
            nodes, argv = trainer_nodes()
            for rank in range(nodes):
                out.append(Service(f"trainer-{rank}", name, argv=[_arg(a, config, rank) for a in argv], env=env))
            continue
        argv = [str(config) if a == CONFIG_IN_IMAGE else str(a) for a in spec["command"]]
        count = replicas(spec)
        for i in range(count):
            out.append(Service(f"{name}-{i + 1}" if count > 1 else name, name, argv=argv, env=env))
    return brokers, settings, out


def _arg(arg: str, config: Path, rank: int) -> str:
    return {"$(NODE_RANK)": str(rank), CONFIG_IN_IMAGE: str(config)}.get(str(arg), str(arg))


class Deployment:
    """The brokers and every service on their hosts, started in the deployment's order: brokers,
    `topics create`, then the services; `poll()` restarts a failed one as compose's policy does."""

    def __init__(self, config: Path, workdir: Path, leave_out: tuple[str, ...] = ("monitor",), proxied: str | None = None):
        """`proxied`: a host whose connections to the brokers go through a Toxiproxy (`self.link`) on a
        host of its own, for the faults a slow link makes."""
        self.config, self.workdir, self.proxied = Path(config), Path(workdir), proxied
        self.brokers, self.broker_settings, services = plan(self.config)
        self.services = [s for s in services if s.service not in leave_out]
        self.net = Hosts([*self.brokers, *(s.host for s in self.services), *(["link"] if proxied else [])])
        self.kafka: LocalKafka | None = None
        self.link: Proxy | None = None

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap_servers

    def service(self, host: str) -> Service:
        return next(s for s in self.services if s.host == host)

    def __enter__(self) -> "Deployment":
        self.net.__enter__()
        try:
            (self.workdir / "logs").mkdir(parents=True, exist_ok=True)
            self.kafka = LocalKafka(self.workdir / "kafka", port=KAFKA_PORT, nodes=len(self.brokers), heap="384m",
                                    hosts=[(self.net.address(b), self.net.namespace(b)) for b in self.brokers],
                                    extra=self.broker_settings).start()
            if self.proxied:
                self.link = Proxy(self.net, self.proxied, at="link",
                                  targets=[(n.host, n.port) for n in self.kafka.state.nodes]).__enter__()
            first = self.services[0].host  # `topics` runs once, from a host of the deployment
            done = self.net.run(first, [*CLI, "topics", "create", "--config", str(self.config)], env=self._env({}),
                                capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise RuntimeError(f"topics create failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
            for s in self.services:
                self._start(s)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _env(self, env: dict[str, str], host: str | None = None) -> dict[str, str]:
        # compose's UNDERTOW_BOOTSTRAP names the broker services (checked in `plan`): here, their addresses
        out = {**os.environ, **env, "UNDERTOW_BOOTSTRAP": self.bootstrap, "OMP_NUM_THREADS": "1"}
        if host is not None:
            out["GLOO_SOCKET_IFNAME"] = "eth0"  # the host's one link: gloo would pick the machine's name's address
        return out

    def _start(self, s: Service) -> None:
        argv = list(s.argv)
        if argv[0] == "torchrun":  # a node of the trainer: its rendezvous at node 0's address, its own address
            argv = [sys.executable, "-m", "torch.distributed.run", f"--local-addr={self.net.address(s.host)}",
                    *[a.replace("trainer-0.trainer", self.net.address("trainer-0")) for a in argv[1:]]]
            argv[argv.index("--nproc-per-node") + 1] = "1"  # a CPU per node, not 8 GPUs
            # Node 0 hosts the rendezvous: in Kubernetes its host name matches the endpoint's, which torchrun
            # looks for; in a namespace the machine's name does not, so it is told.
            argv.insert(3, f"--rdzv-conf=is_host={int(s.host == 'trainer-0')}")
        else:
            argv = [*CLI, *argv]
        s.log = self.workdir / "logs" / f"{s.host}.log"
        with open(s.log, "a") as out:
            out.write(f"--- start {len(s.exits) + 1}: {' '.join(argv)}\n")
            out.flush()
            s.proc = self.net.popen(s.host, argv, env=self._env(s.env, s.host), stdout=out, stderr=subprocess.STDOUT,
                                    cwd=self.workdir, start_new_session=True)

    def poll(self) -> list[Service]:
        """Restart each service that exited with an error (compose's `restart: on-failure`); the ones
        that exited cleanly are returned."""
        finished = []
        for s in self.services:
            code = s.proc.poll() if s.proc else None
            if code is None or s.stopped:
                continue
            if code == 0:
                finished.append(s)
                continue
            if s.exited_at is None:
                s.exits.append(code)
                s.exited_at = time.monotonic()
            if time.monotonic() - s.exited_at >= min(60.0, 0.1 * 2 ** len(s.exits)):  # Docker's doubling delay
                s.restarts += 1
                s.exited_at = None
                self._start(s)
        return finished

    def stop(self, services: list[Service] | None = None, timeout: float = 60) -> None:
        """SIGTERM, as `docker compose stop` sends, then SIGKILL past `timeout`; a stopped service stays
        stopped (`poll` does not restart it)."""
        services = services or self.services
        for s in services:
            s.stopped = True
        chosen = [s for s in services if s.proc and s.proc.poll() is None]
        for s in chosen:
            s.proc.terminate()
        deadline = time.monotonic() + timeout
        for s in chosen:
            try:
                s.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                s.proc.kill()
                s.proc.wait(10)

    def logs(self, tail: int = 1500) -> str:
        return "\n".join(f"--- {s.host} (restarts {s.restarts}, exits {s.exits})\n"
                         f"{s.log.read_text(errors='replace')[-tail:] if s.log and s.log.exists() else ''}"
                         for s in self.services)

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop(timeout=30)
            if self.link is not None:
                self.link.__exit__()
            if self.kafka is not None:
                self.kafka.stop()
        finally:
            self.net.remove()
