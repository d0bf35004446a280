"""Hosts on one machine, for the faults a network makes (issue 48): Linux network namespaces on a
private subnet, joined by a bridge that lives in a namespace of its own, with nftables rules inside
a host's namespace to cut it off.

Everything is made inside namespaces named `uw<pid>-<host index>` and `uw<pid>-switch` (the pid is
the creator's), plus one veth in the machine's own namespace, `uw<pid>`, that lets the creating
process reach the hosts. Each network takes a /24 of 10.213.0.0/16 that no other holds (the creator is .1, the hosts .10 and up).
Deleting the namespaces deletes every link, the bridge and every rule with them. A creator killed
before it could do so leaves them to the next creator: `sweep()` removes whatever a dead pid made.
Traffic goes only to these addresses.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable
from contextlib import suppress
from typing import Any

from tests.helpers import wait_for

NETWORKS, ROOT_ADDRESS, FIRST_HOST = "10.213", 1, 10
PREFIX = "uw"
LOCK = "/tmp/undertow-networks.lock"  # two test workers choosing a subnet at once
_MINE = re.compile(rf"^{PREFIX}(\d+)(-|$)")
TABLE = "inet undertow_faults"


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
        rules = [f"add table {TABLE}",
                 f"add chain {TABLE} input {{ type filter hook input priority 0; }}",
                 f"add chain {TABLE} output {{ type filter hook output priority 0; }}"]
        if inbound:
            rules.append(f"add rule {TABLE} input ip saddr {{ {addresses} }} drop")
        if outbound:
            rules.append(f"add rule {TABLE} output ip daddr {{ {addresses} }} drop")
        subprocess.run(self.command(host, ["nft", "-f", "-"]), input="\n".join(rules) + "\n", text=True,
                       check=True, capture_output=True)

    def heal(self, host: str) -> None:
        """Every rule `cut` put on `host` removed."""
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
