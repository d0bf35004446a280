"""Processor worker benchmark: throughput against a raw passthrough, publish->ready latency, RSS growth.

    python benchmarks/processors_throughput.py [--records 1000000] [--bootstrap host:port]

Starts its own broker unless --bootstrap (or UNDERTOW_BOOTSTRAP) names one. `--records` ~1 KB
experiences in groups of 8 are published once; then, one after the other over the same records:
1. reference: a plain kafka-python consumer -> producer passthrough that forwards the bytes as they
   are to another topic and commits after each flush (the worker's delivery rule, no decoding);
2. worker: one `undertow process` worker with the default pipeline.
Each rate is measured between 10% and 100% of the records handled (startup excluded), with the
process's CPU share over that span; the machine is shared, so the worker is also given as a
percentage of the passthrough measured in the same run. The worker's RSS is read at every 100k
records and at the end; half-way through, each partition's committed share of its records (a fair
drain keeps them close); and the partitions it read again (resyncs: a backlog should cause none). Last, latency: `--latency-seconds` at `--rate` experiences/s, publish ->
consumer-received on experiences.ready, p50/p99/max, beside the same records read straight
from experiences.raw (the harness and broker without the worker).
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
import msgpack  # noqa: E402
from aiokafka import AIOKafkaProducer  # noqa: E402
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth  # noqa: E402
from kafka import KafkaConsumer, TopicPartition  # noqa: E402

from undertow.infra.broker.local import LocalKafka, free_port_block  # noqa: E402
from undertow.schemas import Experience, encode  # noqa: E402
from undertow.streams import KafkaSettings, RecordProducer, Topics, connect, create_topics  # noqa: E402

GROUP = 8


def experience(g: int, i: int, now: float) -> Experience:
    # 200 response tokens * 4 bytes + text ~= 1 KB on the wire
    return Experience(experience_id=f"g{g}/{i}", task_id=f"g{g}", group_id=f"g{g}", group_size=GROUP,
                      sample_index=i, prompt_text="What is 12 + 7?", prompt_tokens=list(range(16)),
                      response_text=f"The answer is {19 + i % 2}.", response_tokens=list(range(200)),
                      reward=float(i % 2), policy_version=0, finish_reason="stop", timestamps={"created": now})


def publish(kafka: KafkaSettings, topic: str, start: int, groups: int) -> None:
    with RecordProducer(kafka, linger_ms=20, batch_size=1 << 20) as p:
        now = time.time()
        for g in range(start, start + groups):
            for i in range(GROUP):
                p.send_bytes(topic, encode(experience(g, i, now)), key=f"g{g}")


def paced_publish(kafka: KafkaSettings, topic: str, start: int, groups: int, rate: float) -> None:
    """Publish at `rate` records/s, each stamped "created" as it is sent. aiokafka: kafka-python's
    producer falls behind 1,000/s on a busy 2-core machine, and its lag would count as latency."""

    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=kafka.hosts, acks="all", linger_ms=1,
                                    **credentials_to_aiokafka_auth(kafka.faust_credentials()))
        await producer.start()
        try:
            t0, pending = time.time(), []
            for n in range(groups * GROUP):
                delay = t0 + n / rate - time.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                g, i = start + n // GROUP, n % GROUP
                pending.append(await producer.send(topic, encode(experience(g, i, time.time())), key=f"g{g}".encode()))
            await asyncio.gather(*pending)
        finally:
            await producer.stop()

    asyncio.run(run())


def passthrough(kafka: KafkaSettings, source: str, dest: str, records: int, stop: Event) -> None:
    """Forward `records` raw records from `source` to `dest`, committing after each flush; then
    wait for `stop` (a process that exited could no longer be asked for its CPU time)."""
    consumer = connect(KafkaConsumer, kafka, source, group_id=f"passthrough-{uuid.uuid4().hex[:6]}",
                       auto_offset_reset="earliest", enable_auto_commit=False, max_poll_records=1000)
    with RecordProducer(kafka, linger_ms=5, batch_size=1 << 20) as producer:
        done = 0
        while done < records:
            for batch in consumer.poll(timeout_ms=500).values():
                for m in batch:
                    producer.send_bytes(dest, m.value, key=m.key)
                done += len(batch)
            producer.flush()
            consumer.commit()
    consumer.close()
    stop.wait()


class Progress:
    """Records on some topics now, read with one consumer kept open: opening one per look (as
    `record_counts` does) cost the machine a third of a core, taken from what is being measured."""

    def __init__(self, kafka: KafkaSettings, topics: list[str]):
        self.consumer = connect(KafkaConsumer, kafka)
        self.parts = [TopicPartition(t, p) for t in topics for p in self.consumer.partitions_for_topic(t) or ()]

    def __call__(self) -> int:
        return sum(self.consumer.end_offsets(self.parts).values())  # the topics are new: they start at 0

    def close(self) -> None:
        self.consumer.close()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throughput(count: Callable[[], int], pid: int, alive: Callable[[], bool], records: int,
               track_rss: bool = False) -> dict:
    """Records/s of process `pid` between 10% and 100% of `records` handled, as `count` reports them."""
    marks: dict[str, float] = {}
    rss: dict[str, float] = {}
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        n = count()
        if n >= records // 10 and "start" not in marks:
            marks["start"], marks["start_n"], marks["start_cpu"] = time.monotonic(), n, cpu_s(pid)
        mark = f"{n // 100_000 * 100}k"
        if track_rss and n >= 100_000 and mark not in rss:
            rss[mark] = rss_mb(pid)
            print(f"processed {n}: worker RSS {rss[mark]:.1f} MB", flush=True)
        if n >= records:
            marks["end"], marks["end_cpu"] = time.monotonic(), cpu_s(pid)
            rss["end"] = rss_mb(pid)
            break
        if not alive():
            break
        time.sleep(0.5)
    if "end" not in marks:
        raise RuntimeError(f"pid {pid} stopped or stalled after {count()} of {records} records")
    if marks["end"] - marks["start"] < 1.0:  # within one or two samples: a rate of noise, or 0/0
        raise RuntimeError(f"{records} records went by in under a second of measuring: too few for a rate; "
                           "ask for more (--records)")
    rate = (records - marks["start_n"]) / (marks["end"] - marks["start"])
    # CPU share while draining: ~1.0 means the process itself is the bottleneck
    busy = (marks["end_cpu"] - marks["start_cpu"]) / (marks["end"] - marks["start"])
    # per CPU-second: what it does with a core to itself (the machine is shared)
    out = {"per_s": round(rate), "cpu_share": round(busy, 2), "per_cpu_s": round(rate / max(busy, 1e-9))}
    if track_rss:
        out["rss_mb"] = {k: round(v, 1) for k, v in rss.items()}
    return out


def reference(kafka: KafkaSettings, source: str, records: int) -> dict:
    ref_ns = f"ref-{uuid.uuid4().hex[:6]}"
    create_topics(kafka, ref_ns)
    dest = Topics(ref_ns).ready
    fork = multiprocessing.get_context("fork")
    stop = fork.Event()
    proc = fork.Process(target=passthrough, args=(kafka, source, dest, records, stop))
    proc.start()
    progress = Progress(kafka, [dest])
    try:
        return throughput(progress, proc.pid, proc.is_alive, records)
    finally:
        progress.close()
        stop.set()
        proc.join(60)


class Balance:
    """How evenly the worker drains the partitions: each partition's committed share of its records,
    taken once the worker has committed half of all of them."""

    def __init__(self, kafka: KafkaSettings, group: str, topic: str):
        self.consumer = connect(KafkaConsumer, kafka, group_id=group, enable_auto_commit=False)
        self.parts = [TopicPartition(topic, p) for p in sorted(self.consumer.partitions_for_topic(topic))]
        self.totals = self.consumer.end_offsets(self.parts)
        self.halfway: dict[int, float] | None = None

    def look(self) -> None:
        if self.halfway is not None:
            return
        done = {tp: self.consumer.committed(tp) or 0 for tp in self.parts}
        if 2 * sum(done.values()) >= sum(self.totals.values()):
            self.halfway = {tp.partition: round(done[tp] / max(1, self.totals[tp]), 2) for tp in self.parts}

    def close(self) -> None:
        self.consumer.close()


def worker_run(kafka: KafkaSettings, topics: Topics, config: Path, records: int, app_id: str,
               log: Path) -> tuple[dict, subprocess.Popen]:
    """One `undertow process` worker over `records` waiting raw records: its rate, RSS, how evenly it
    took the partitions, and how often it read a partition again (a resync: 0 expected)."""
    with open(log, "w") as out:
        worker = subprocess.Popen([sys.executable, "-m", "undertow.infra.cli", "process", str(config)], cwd=ROOT,
                                  stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    progress = Progress(kafka, [topics.ready, topics.rejected])
    balance = Balance(kafka, app_id, topics.raw)

    def count() -> int:
        balance.look()
        return progress()

    try:
        try:
            out = throughput(count, worker.pid, lambda: worker.poll() is None, records, track_rss=True)
        except RuntimeError as e:
            raise RuntimeError(f"{e}; the worker's log ends:\n{log.read_text()[-3000:]}") from None
        out["halfway_shares"] = balance.halfway
        out["resyncs"] = log.read_text().count("reading it again")
        return out, worker
    finally:
        progress.close()
        balance.close()


def latency(kafka: KafkaSettings, topics: Topics, start_group: int, rate: float, seconds: float) -> dict:
    """publish -> received on experiences.ready (through the worker) and on experiences.raw (the same
    records straight from the broker: what this harness and machine add without any worker)."""
    consumer = connect(KafkaConsumer, kafka, group_id=None, auto_offset_reset="latest")
    consumer.assign([TopicPartition(t, p) for t in (topics.raw, topics.ready)
                     for p in consumer.partitions_for_topic(t)])
    consumer.seek_to_end()
    for tp in consumer.assignment():  # resolve now: a lazy seek would skip what arrives before it
        consumer.position(tp)
    groups = int(rate * seconds / GROUP)
    # its own process: paced sending must not queue behind this one's reading
    sender = multiprocessing.get_context("fork").Process(target=paced_publish,
                                                         args=(kafka, topics.raw, start_group, groups, rate))
    sender.start()
    waits: dict[str, list[float]] = {topics.raw: [], topics.ready: []}
    deadline = time.time() + seconds + 30
    while len(waits[topics.ready]) < groups * GROUP and time.time() < deadline:
        for tp, batch in consumer.poll(timeout_ms=200).items():
            now = time.time()  # msgpack alone: validating each record here would slow the reader
            waits[tp.topic] += [now - msgpack.unpackb(m.value)["timestamps"]["created"] for m in batch]
    sender.join()
    consumer.close()

    def summary(w: list[float]) -> dict:
        w.sort()
        pick = lambda q: round(1000 * w[min(len(w) - 1, int(q * len(w)))], 1) if w else None  # noqa: E731
        return {"received": len(w), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "max_ms": pick(1.0)}

    return {"rate": rate, "worker": summary(waits[topics.ready]), "no_worker": summary(waits[topics.raw])}


def shut_down(worker: subprocess.Popen | None, broker: LocalKafka | None) -> None:
    """Stop the worker (SIGTERM: it commits and leaves its group) and the benchmark's own broker."""
    if worker is not None:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
    if broker:
        broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000, help="records for the throughput/RSS run")
    ap.add_argument("--rate", type=float, default=1000.0, help="experiences/s for the latency run")
    ap.add_argument("--latency-seconds", type=float, default=10.0)
    ap.add_argument("--bootstrap", default=os.environ.get("UNDERTOW_BOOTSTRAP"))
    args = ap.parse_args()
    broker = None
    if not args.bootstrap:
        broker = LocalKafka(Path(tempfile.mkdtemp()), port=free_port_block(2)).start()
        args.bootstrap = broker.bootstrap_servers
    kafka = KafkaSettings(bootstrap_servers=args.bootstrap)
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    create_topics(kafka, ns)
    topics = Topics(ns)
    config = Path(tempfile.mkdtemp()) / "bench.yaml"
    config.write_text(yaml.safe_dump({"namespace": ns, "kafka": {"bootstrap_servers": args.bootstrap},
                                      "processors": {"app_id": f"bench-{ns}", "metrics_every_s": 5.0}}))
    groups = args.records // GROUP
    records = groups * GROUP
    worker = None
    try:
        t = time.monotonic()
        publish(kafka, topics.raw, 0, groups)
        print(f"published {records} records in {time.monotonic() - t:.1f} s", flush=True)
        result: dict = {"records": records, "passthrough": reference(kafka, topics.raw, records)}
        print(result, flush=True)
        result["worker"], worker = worker_run(kafka, topics, config, records, f"bench-{ns}", config.with_suffix(".log"))
        result["worker_vs_passthrough"] = f"{100 * result['worker']['per_s'] / result['passthrough']['per_s']:.0f}%"
        print(result, flush=True)
        result["latency"] = latency(kafka, topics, groups, args.rate, args.latency_seconds)
        print(result, flush=True)
        print(f"worker = {result['worker_vs_passthrough']} of raw passthrough "
              f"({result['worker']['per_s']} vs {result['passthrough']['per_s']} records/s)", flush=True)
        shares = result["worker"]["halfway_shares"] or {}
        print(f"partitions half-way: the slowest had {min(shares.values(), default=0):.0%} of its records done, "
              f"the fastest {max(shares.values(), default=0):.0%}; resyncs {result['worker']['resyncs']}", flush=True)
        rss = result["worker"]["rss_mb"]
        if "100k" in rss:
            print(f"worker RSS after {records} records = {rss['end'] / rss['100k']:.2f} x its RSS after 100k "
                  f"({rss['end']:.0f} vs {rss['100k']:.0f} MB; highest {max(rss.values()):.0f} MB)", flush=True)
        lat = result["latency"]
        print(f"publish -> ready at {lat['rate']:.0f}/s: p50 {lat['worker']['p50_ms']} ms, p99 {lat['worker']['p99_ms']} ms "
              f"(broker alone: p50 {lat['no_worker']['p50_ms']} ms, p99 {lat['no_worker']['p99_ms']} ms)", flush=True)
    finally:
        shut_down(worker, broker)


if __name__ == "__main__":
    main()
