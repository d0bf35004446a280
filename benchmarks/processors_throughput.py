"""Processor worker benchmark: throughput, publish->ready latency, RSS growth.

    python benchmarks/processors_throughput.py --records 1000000 [--bootstrap host:port]

One worker (`undertow process`, default pipeline) on ~1 KB experiences in groups of 8:
1. throughput: `--records` are published first, then the worker drains them; experiences/s is
   measured between 10% and 100% processed (startup excluded), with the worker's CPU share over
   that span (the machine is shared: experiences per worker CPU-second is the steadier figure);
   the worker's RSS is read at every 100k records processed and at the end.
2. latency: `--latency-seconds` at `--rate` experiences/s; publish -> consumer-received on
   experiences.ready, p50/p99.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml
from kafka import KafkaConsumer

from infra.broker import LocalKafka, free_port_block
from schemas import Experience, decode, encode
from streams import KafkaSettings, RecordProducer, Topics, create_topics, record_counts

ROOT = Path(__file__).resolve().parents[1]
GROUP = 8


def experience(g: int, i: int, now: float) -> Experience:
    # 200 response tokens * 4 bytes + text ~= 1 KB on the wire
    return Experience(experience_id=f"g{g}/{i}", task_id=f"g{g}", group_id=f"g{g}", group_size=GROUP,
                      sample_index=i, prompt_text="What is 12 + 7?", prompt_tokens=list(range(16)),
                      response_text=f"The answer is {19 + i % 2}.", response_tokens=list(range(200)),
                      reward=float(i % 2), policy_version=0, finish_reason="stop", timestamps={"created": now})


def publish(kafka: KafkaSettings, topic: str, start: int, groups: int, rate: float | None = None) -> None:
    # paced: a short linger, or the publisher's own batching delay counts as processing latency
    with RecordProducer(kafka, linger_ms=2 if rate else 20, batch_size=1 << 20) as p:
        t0 = time.time()
        for g in range(start, start + groups):
            for i in range(GROUP):
                if rate:
                    delay = t0 + ((g - start) * GROUP + i) / rate - time.time()
                    if delay > 0:
                        time.sleep(delay)
                p.send_bytes(topic, encode(experience(g, i, time.time())), key=f"g{g}")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def cpu_s(pid: int) -> float:
    """User + system CPU seconds the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def processed(kafka: KafkaSettings, topics: Topics) -> int:
    counts = record_counts(kafka, [topics.ready, topics.rejected])
    return counts[topics.ready] + counts[topics.rejected]


def throughput(kafka: KafkaSettings, topics: Topics, worker: subprocess.Popen, records: int) -> dict:
    marks: dict[str, float] = {}
    rss: dict[str, float] = {}
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline and worker.poll() is None:
        n = processed(kafka, topics)
        if n >= records // 10 and "start" not in marks:
            marks["start"], marks["start_n"], marks["start_cpu"] = time.monotonic(), n, cpu_s(worker.pid)
        mark = f"{n // 100_000 * 100}k"
        if n >= 100_000 and mark not in rss:
            rss[mark] = rss_mb(worker.pid)
            print(f"processed {n}: worker RSS {rss[mark]:.1f} MB", flush=True)
        if n >= records:
            marks["end"], marks["end_cpu"] = time.monotonic(), cpu_s(worker.pid)
            rss["end"] = rss_mb(worker.pid)
            break
        time.sleep(0.5)  # each look costs the machine a consumer: keep it from competing with the worker
    rate = (records - marks["start_n"]) / (marks["end"] - marks["start"])
    # CPU share of the worker while draining: ~1.0 means the worker itself is the bottleneck
    busy = (marks["end_cpu"] - marks["start_cpu"]) / (marks["end"] - marks["start"])
    # per CPU-second of the worker: what one worker does with a core to itself (the machine is shared)
    return {"experiences_per_s": round(rate), "worker_cpu_share": round(busy, 2),
            "experiences_per_worker_cpu_s": round(rate / max(busy, 1e-9)),
            "rss_mb": {k: round(v, 1) for k, v in rss.items()}}


def latency(kafka: KafkaSettings, topics: Topics, start_group: int, rate: float, seconds: float) -> dict:
    consumer = KafkaConsumer(topics.ready, **kafka.kafka_python(), group_id=None, auto_offset_reset="latest")
    while not consumer.assignment():
        consumer.poll(timeout_ms=200)
    consumer.seek_to_end()
    for tp in consumer.assignment():  # resolve now: a lazy seek would skip what arrives before it
        consumer.position(tp)
    groups = int(rate * seconds / GROUP)
    import threading

    sender = threading.Thread(target=publish, args=(kafka, topics.raw, start_group, groups, rate))
    sender.start()
    waits = []
    deadline = time.time() + seconds + 30
    while len(waits) < groups * GROUP and time.time() < deadline:
        for batch in consumer.poll(timeout_ms=200).values():
            now = time.time()
            waits += [now - decode(m.value, expect=Experience).timestamps["created"] for m in batch]
    sender.join()
    consumer.close()
    waits.sort()
    pick = lambda q: round(1000 * waits[min(len(waits) - 1, int(q * len(waits)))], 1)  # noqa: E731
    return {"rate": rate, "received": len(waits), "p50_ms": pick(0.5), "p99_ms": pick(0.99)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000, help="records for the throughput/RSS run")
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
    t = time.monotonic()
    publish(kafka, topics.raw, 0, groups)
    print(f"published {groups * GROUP} records in {time.monotonic() - t:.1f} s", flush=True)
    worker = subprocess.Popen([sys.executable, "-m", "infra.cli", "process", str(config)], cwd=ROOT,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        result = {"records": groups * GROUP, **throughput(kafka, topics, worker, groups * GROUP)}
        print(result, flush=True)
        result["latency"] = latency(kafka, topics, groups, args.rate, args.latency_seconds)
        print(result, flush=True)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(60)
        if broker:
            broker.stop()


if __name__ == "__main__":
    main()
