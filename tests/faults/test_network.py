"""Hosts in network namespaces (tests/faults/network.py): cuts, lossy and slow links, nothing left
behind; and what the Kafka clients do across them when the network fails (issue 48): a broker cut
off from the other two while clients still reach it, with the books checked after."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from undertow.infra.broker.local import LocalKafka
from undertow.streams import KafkaSettings, Topics, create_topics
from tests.faults.network import Hosts, Proxy, sweep
from tests.helpers import Sending, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]

# What a host answers on, and whether another reaches it: a TCP connect with a short timeout.
LISTEN = "import socket,sys; s=socket.create_server((sys.argv[1], 7000)); print('up', flush=True)\n" \
         "while True: s.accept()[0].close()"
CONNECT = "import socket,sys; socket.create_connection((sys.argv[1], 7000), timeout=1.5).close()"


def reaches(net: Hosts, source: str, target: str) -> bool:
    return net.run(source, [sys.executable, "-c", CONNECT, net.address(target)], capture_output=True).returncode == 0


def test_hosts_reach_each_other_until_cut_and_leave_nothing_behind():
    with Hosts(["a", "b", "c"]) as net:
        listener = net.popen("a", [sys.executable, "-c", LISTEN, net.address("a")], stdout=subprocess.PIPE, text=True)
        assert listener.stdout.readline().strip() == "up"
        assert reaches(net, "b", "a") and reaches(net, "c", "a")
        net.cut("a", ["b"])
        assert not reaches(net, "b", "a") and reaches(net, "c", "a")  # only the pair named
        net.heal("a")
        assert reaches(net, "b", "a")
        net.cut("a", ["c"], inbound=False)  # c's packets arrive; a's answers never leave: c times out all the same
        assert not reaches(net, "c", "a") and reaches(net, "b", "a")
        net.heal("a")
        net.link("a", up=False)
        assert not reaches(net, "b", "a")
        net.link("a", up=True)
        assert wait_for(lambda: reaches(net, "b", "a"), 30, "a back once its link is up")
    assert net.leftovers() == [] and listener.wait(10) is not None  # its process went with its host


ECHO = ("import socket,sys; s=socket.create_server((sys.argv[1], 7001)); print('up', flush=True)\n"
        "while True:\n c=s.accept()[0]; c.sendall(c.recv(100)); c.close()")
ROUND_TRIP = ("import socket,sys,time; t=time.monotonic(); c=socket.create_connection((sys.argv[1], 7001), timeout=5)\n"
              "c.sendall(b'ping'); assert c.recv(100) == b'ping'; print(time.monotonic() - t)")


def test_a_proxied_link_is_as_slow_as_its_toxics_and_a_lossy_one_drops():
    with Hosts(["a", "b", "link"]) as net:
        echo = net.popen("a", [sys.executable, "-c", ECHO, net.address("a")], stdout=subprocess.PIPE, text=True)
        assert echo.stdout.readline().strip() == "up"

        def round_trip() -> subprocess.CompletedProcess:
            return net.run("b", [sys.executable, "-c", ROUND_TRIP, net.address("a")], capture_output=True, text=True)

        with Proxy(net, "b", at="link", targets=[(net.address("a"), 7001)]) as link:
            assert round_trip().returncode == 0  # b still dials a's address, through the proxy
            link.toxic("latency", streams=("upstream",), latency=400, jitter=0)
            slow = round_trip()
            assert slow.returncode == 0 and float(slow.stdout) >= 0.4, slow  # only a proxy in the path delays it
            link.clear()
            net.lose("b", 100)
            assert round_trip().returncode != 0
            net.heal("b")
            assert round_trip().returncode == 0
    assert net.leftovers() == []


def test_a_killed_creator_leaves_its_hosts_to_the_next_one():
    code = ("import sys, time; sys.path.insert(0, '.'); from tests.faults.network import Hosts\n"
            "net = Hosts(['x', 'y']).__enter__(); print(net.tag, flush=True); time.sleep(600)")
    creator = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    tag = creator.stdout.readline().strip()
    creator.kill()
    creator.wait(10)
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert f"{tag}-switch" in listed  # left behind by the SIGKILL
    assert {f"{tag}-switch", f"{tag}-0", f"{tag}-1", tag} <= set(sweep())
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout + \
        subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    assert tag not in listed


@pytest.mark.timeout(600)
def test_a_broker_cut_off_from_the_other_two_loses_nothing_acknowledged(tmp_path):
    """Broker 1 cannot see brokers 2 and 3 while the producer (the creating process) still reaches all
    three. The producer sends one record at a time, so 100 more acknowledged during the cut means the
    leaders moved off broker 1; every acknowledged record is then read back, once."""
    with Hosts(["kafka-1", "kafka-2", "kafka-3"]) as net:
        cluster = LocalKafka(tmp_path / "kafka", port=19092, nodes=3, heap="384m",
                             hosts=[(net.address(h), net.namespace(h)) for h in net.hosts],
                             extra={"replica.lag.time.max.ms": "10000"})  # the ISR drops broker 1 sooner
        try:
            cluster.start()
            kafka = KafkaSettings(bootstrap_servers=cluster.bootstrap_servers)
            topics = Topics("netcut")
            create_topics(kafka, "netcut", partitions={"tasks": 3})
            with Sending(kafka, topics.tasks) as sends:
                sends.more(100, "before the cut")
                net.cut("kafka-1", ["kafka-2", "kafka-3"])
                # Seen from broker 2's host, which no longer reaches broker 1: the cluster moved on without it.
                seen = lambda: partitions(net, "kafka-2", cluster, topics.tasks)
                wait_for(lambda: (now := seen()) and all(leader != 1 and 1 not in isr for leader, isr in now), 120,
                         "every partition led and replicated without broker 1", state=seen)
                started = time.monotonic()
                # Broker 1 answers REQUEST_TIMED_OUT, which refreshes no metadata: the producer's own refresh
                # (every 30 s, streams/producer.py) finds the new leaders; kafka-python's default waited up to 300 s.
                sends.more(100, "with broker 1 cut off from brokers 2 and 3", timeout=120)
                print(f"100 acknowledged {time.monotonic() - started:.0f} s after the leaders moved")
                net.heal("kafka-1")
                sends.more(100, "after the heal")

            sends.check_read_back(kafka)
        finally:
            cluster.stop()
    assert net.leftovers() == []


DESCRIBE = ("import json, sys; from kafka import KafkaAdminClient\n"
            "admin = KafkaAdminClient(bootstrap_servers=sys.argv[1], request_timeout_ms=10000)\n"
            "print(json.dumps([[p['leader_id'], p['isr_nodes']] for p in admin.describe_topics([sys.argv[2]])[0]['partitions']]))")


def partitions(net: Hosts, host: str, cluster: LocalKafka, topic: str) -> list[tuple[int, list[int]]]:
    """[(leader, in-sync replicas)] of each partition of `topic`, as `host`'s broker tells it to a client on `host`."""
    node = cluster.state.nodes[net.hosts.index(host)]
    out = net.run(host, [sys.executable, "-c", DESCRIBE, f"{node.host}:{node.port}", topic], capture_output=True,
                  text=True, timeout=60)
    if out.returncode != 0:
        print(f"describe from {host} failed: {out.stderr[-500:]}")
        return []
    return [tuple(p) for p in json.loads(out.stdout)]
