"""Hosts on one machine, for the faults a network makes (issue 48): Linux network namespaces on a
private subnet, joined by a bridge that lives in a namespace of its own, with nftables rules inside
a host's namespace to cut it off or lose its packets, and a Toxiproxy on a host of its own for what
nftables cannot do (this kernel has no `netem`): latency and a bandwidth cap.

Everything is made inside namespaces named `uw<pid>-<host index>` and `uw<pid>-switch` (the pid is
the creator's), plus one veth in the machine's own namespace, `uw<pid>`, that lets the creating
process reach the hosts. Each network takes a /24 of 10.213.0.0/16 that no other holds (the creator is .1, the hosts .10 and up).
Deleting the namespaces deletes every link, the bridge and every rule with them. A creator killed
before it could do so leaves them to the next creator: `sweep()` removes whatever a dead pid made.
Traffic goes only to these addresses.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Iterable
from contextlib import suppress
from typing import Any

from tests.helpers import wait_for

NETWORKS, ROOT_ADDRESS, FIRST_HOST = "10.213", 1, 10
PREFIX = "uw"
LOCK = "/tmp/undertow-networks.lock"  # two test workers choosing a subnet at once
_MINE = re.compile(rf"^{PREFIX}(\d+)(-|$)")
TABLE = "inet undertow_faults"
NAT = "ip undertow_proxy"
TOXIPROXY = os.environ.get("UNDERTOW_TOXIPROXY", os.path.expanduser("~/.cache/undertow/toxiproxy/bin/server"))
TOXIPROXY_API = 8474  # its HTTP API; each proxied target listens on a port after it
DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # to the hosts, never through $http_proxy


def unavailable() -> str | None:
    """Why hosts cannot be made here, or None."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "nft") if shutil.which(tool) is None]
    if missing:
        return f"missing {', '.join(missing)} (iproute2, nftables from Debian: infra/bootstrap.sh installs them)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe)
    return None


def sweep() -> list[str]:
    """Remove the namespaces and root links of creators that are gone (a killed test's). Returns their names."""
    gone = []
    for name in _names(["ip", "netns", "list"]) + _names(["ip", "-o", "link", "show"], link=True):
        match = _MINE.match(name)
        if match and not _alive(int(match.group(1))):
            if name.startswith(f"{PREFIX}{match.group(1)}-"):
                _remove_namespace(name)
            else:
                _ip("link", "del", name, check=False)
            gone.append(name)
    return gone


class Hosts:
    """`hosts` named hosts, each a namespace with one address, on one switch; a context manager.

        with Hosts(["kafka-1", "kafka-2", "rollout-1"]) as net:
            net.address("kafka-1")                    # 10.213.0.10
            net.popen("rollout-1", ["python", ...])   # a process on that host
            net.cut("kafka-1", ["kafka-2"])           # no packet between them, either way
            net.heal("kafka-1")
    """

    def __init__(self, hosts: Iterable[str]):
        self.hosts = list(hosts)
        if len(set(self.hosts)) != len(self.hosts) or len(self.hosts) > 200:
            raise ValueError(f"hosts: expected up to 200 distinct names, got {self.hosts}")
        self.tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.tag}-switch"
        self.subnet = ""  # chosen on entry

    def namespace(self, host: str) -> str:
        return f"{self.tag}-{self.hosts.index(host)}"

    def address(self, host: str) -> str:
        return f"{self.subnet}.{FIRST_HOST + self.hosts.index(host)}"

    @property
    def own_address(self) -> str:
        """The creating process's address on the network."""
        return f"{self.subnet}.{ROOT_ADDRESS}"

    def command(self, host: str, argv: list[str]) -> list[str]:
        """`argv` as run on `host` (exec'd in its namespace: the pid is the program's)."""
        return ["ip", "netns", "exec", self.namespace(host), *argv]

    def popen(self, host: str, argv: list[str], **kw: Any) -> subprocess.Popen:
        return subprocess.Popen(self.command(host, argv), **kw)

    def run(self, host: str, argv: list[str], **kw: Any) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(host, argv), **kw)

    # -- faults -------------------------------------------------------------------------------

    def cut(self, host: str, peers: Iterable[str], inbound: bool = True, outbound: bool = True) -> None:
        """Drop `host`'s packets from (inbound) and to (outbound) each of `peers`, in its own namespace:
        silently, as a partition does, so the other side learns of it only by its timeouts."""
        addresses = ", ".join(self.address(p) if p in self.hosts else p for p in peers)
        self._drop(host, *([f"input ip saddr {{ {addresses} }}"] if inbound else []),
                   *([f"output ip daddr {{ {addresses} }}"] if outbound else []))

    def lose(self, host: str, percent: float) -> None:
        """Drop `percent` of `host`'s packets at random, each way (a lossy link: TCP resends them)."""
        if not 0 < percent <= 100:
            raise ValueError(f"percent: expected more than 0 and at most 100, got {percent}")
        share = round(percent * 100)  # of 10,000
        match = f"numgen random mod 10000 < {share}" if share < 10000 else ""  # 100%: every packet
        self._drop(host, f"input {match}", f"output {match}")

    def _drop(self, host: str, *matches: str) -> None:
        """A drop rule in `host`'s namespace for each "<chain> <match>"; `heal` removes them all."""
        rules = [f"add table {TABLE}",
                 f"add chain {TABLE} input {{ type filter hook input priority 0; }}",
                 f"add chain {TABLE} output {{ type filter hook output priority 0; }}",
                 *(f"add rule {TABLE} {match} drop" for match in matches)]
        self.nft(host, rules)

    def nft(self, host: str, rules: list[str]) -> None:
        """nftables `rules` (one command each) applied in `host`'s namespace, all or none."""
        subprocess.run(self.command(host, ["nft", "-f", "-"]), input="\n".join(rules) + "\n", text=True,
                       check=True, capture_output=True)

    def heal(self, host: str) -> None:
        """Every rule `cut` and `lose` put on `host` removed."""
        self.run(host, ["nft", "delete", "table", *TABLE.split()], capture_output=True)  # none there: nothing to do

    def link(self, host: str, up: bool) -> None:
        """`host`'s only link down (every connection of it stalls) or back up."""
        self.run(host, ["ip", "link", "set", "eth0", "up" if up else "down"], check=True)

    # -- making and removing --------------------------------------------------------------------

    def __enter__(self) -> "Hosts":
        why_not = unavailable()
        if why_not:  # CI has root and bootstrap installs nft: a missing piece fails the test, not skips it
            raise RuntimeError(f"cannot make test hosts here: {why_not}")
        with open(LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            sweep()
            taken = {line.split()[3].rsplit(".", 1)[0] for line in _lines(["ip", "-o", "-4", "addr", "show"])
                     if f" {NETWORKS}." in line}
            self.subnet = next(f"{NETWORKS}.{i}" for i in range(256) if f"{NETWORKS}.{i}" not in taken)
            self._make()
        return self

    def _make(self) -> None:
        try:
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i, host in enumerate(self.hosts):
                ns = self.namespace(host)
                _ip("netns", "add", ns)
                _ip("-n", ns, "link", "set", "lo", "up")
                _ip("link", "add", "eth0", "netns", ns, "type", "veth", "peer", "name", f"port{i}", "netns", self.switch)
                _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", self.switch, "link", "set", f"port{i}", "master", "br0", "up")
            _ip("link", "add", self.tag, "type", "veth", "peer", "name", "port-root", "netns", self.switch)
            _ip("addr", "add", f"{self.own_address}/24", "dev", self.tag)
            _ip("link", "set", self.tag, "up")
            _ip("-n", self.switch, "link", "set", "port-root", "master", "br0", "up")
        except BaseException:
            self.remove()
            raise

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def remove(self) -> None:
        """Kill what runs on the hosts, delete their namespaces, the switch's and the root link."""
        for ns in [self.namespace(h) for h in self.hosts] + [self.switch]:
            _remove_namespace(ns)
        _ip("link", "del", self.tag, check=False)  # gone with its peer already, unless the switch never was

    def leftovers(self) -> list[str]:
        """What of this network still exists (nothing, once removed)."""
        return [n for n in _names(["ip", "netns", "list"]) + _names(["ip", "-o", "link", "show"], link=True)
                if n == self.tag or n.startswith(f"{self.tag}-")]


class Proxy:
    """A Toxiproxy (a TCP proxy made for injecting faults) on host `at`, which `host`'s connections to
    each (address, port) of `targets` go through: `host` routes those addresses to `at`, where nftables
    redirects them to the proxy's own port, and the proxy connects on to the target. The link's faults
    are then the proxy's toxics (latency, bandwidth), while the clients still dial the real addresses.

        with Proxy(net, "rollout-1", at="link", targets=[("10.213.0.10", 9092)]) as link:
            link.toxic("latency", latency=100, jitter=20)
            link.clear()
    """

    def __init__(self, net: Hosts, host: str, at: str, targets: list[tuple[str, int]]):
        self.net, self.host, self.at, self.targets = net, host, at, targets
        self.api = f"http://{net.address(at)}:{TOXIPROXY_API}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Proxy":
        if not os.access(TOXIPROXY, os.X_OK):
            raise RuntimeError(f"no Toxiproxy at {TOXIPROXY} (infra/bootstrap.sh builds it with `go install`)")
        self.proc = self.net.popen(self.at, [TOXIPROXY, "-host", "0.0.0.0", "-port", str(TOXIPROXY_API)],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(lambda: self._call("GET", "/version", quiet=True) is not None, 30, "Toxiproxy's API up")
        rules = [f"add table {NAT}", f"add chain {NAT} prerouting {{ type nat hook prerouting priority -100; }}"]
        for i, (address, port) in enumerate(self.targets):
            listen = TOXIPROXY_API + 1 + i
            self._call("POST", "/proxies", {"name": f"p{i}", "listen": f"0.0.0.0:{listen}",
                                            "upstream": f"{address}:{port}", "enabled": True})
            rules.append(f"add rule {NAT} prerouting ip daddr {address} tcp dport {port} redirect to :{listen}")
        self.net.nft(self.at, rules)
        for address in sorted({a for a, _ in self.targets}):
            _ip("-n", self.net.namespace(self.host), "route", "add", f"{address}/32", "via", self.net.address(self.at))
        return self

    def toxic(self, kind: str, streams: tuple[str, ...] = ("upstream", "downstream"), **attributes: float) -> None:
        """A toxic of `kind` (Toxiproxy's: latency, bandwidth, ...) on every target, on `streams`
        (upstream: what `host` sends)."""
        for i in range(len(self.targets)):
            for stream in streams:
                self._call("POST", f"/proxies/p{i}/toxics", {"name": f"{kind}-{stream}", "type": kind,
                                                             "stream": stream, "attributes": attributes})

    def clear(self) -> None:
        """Every toxic removed: the link is as good as the others again."""
        for i in range(len(self.targets)):
            for toxic in self._call("GET", f"/proxies/p{i}/toxics") or []:
                self._call("DELETE", f"/proxies/p{i}/toxics/{toxic['name']}")

    def __exit__(self, *exc: object) -> None:
        for address in sorted({a for a, _ in self.targets}):
            _ip("-n", self.net.namespace(self.host), "route", "del", f"{address}/32", check=False)
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(10)

    def _call(self, method: str, path: str, body: dict | None = None, quiet: bool = False) -> Any:
        request = urllib.request.Request(self.api + path, method=method, data=None if body is None else
                                         json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        try:
            with DIRECT.open(request, timeout=10) as answer:
                text, kind = answer.read(), answer.headers.get_content_type()
        except OSError:
            if quiet:
                return None
            raise
        return json.loads(text) if kind == "application/json" else text.decode()


def _remove_namespace(ns: str) -> None:
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in map(int, pids):
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in map(int, pids):  # a namespace lives on while a process holds it, and its links with it
        with suppress(ChildProcessError):
            os.waitpid(pid, 0)
        wait_for(lambda: not _alive(pid), 30, f"process {pid} of {ns} gone after its SIGKILL")
    _ip("netns", "del", ns, check=False)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is gone for our purpose: it holds no namespace
        with open(f"/proc/{pid}/stat") as stat:
            return not stat.read().split(") ", 1)[1].startswith("Z")
    except FileNotFoundError:
        return False


def _lines(argv: list[str]) -> list[str]:
    return subprocess.run(argv, capture_output=True, text=True).stdout.splitlines()


def _names(argv: list[str], link: bool = False) -> list[str]:
    out = _lines(argv)
    if link:  # "12: uw123@if3: <...>"
        return [line.split(":")[1].strip().split("@")[0] for line in out if line.count(":") >= 2]
    return [line.split()[0] for line in out if line.strip()]


def _ip(*args: str, check: bool = True) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")
