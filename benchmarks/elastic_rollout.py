"""Rollout throughput with one worker, then two, each an `undertow rollout` process of its own: the
second joins the running consumer group, as on another machine (tests/rollout/test_elastic_broker.py
runs both in one process and shows the hand-over, not the scaling).

    python benchmarks/elastic_rollout.py [--tasks 40000] [--window 20]

A backlog of tasks (the tiny model, 8 new tokens, groups of 2: tests/rollout/test_elastic_broker.py's
settings) is published first; worker A starts alone and its rate is measured over `--window` seconds
from the group's committed offsets on the tasks topic (so it counts what was generated, published
and committed, in any process); then worker B starts, and once the group is stable with two members
and B has committed, the pair is measured over the same window. `uptime`'s load average is printed
beside each figure: with 2 shared cores the second process competes with the first for CPU, so the
ratio bounds what one machine gives, not what a worker on a machine of its own would add. A backlog
that runs out inside a window makes its rate meaningless, so that stops the benchmark (6000 tasks did:
the "0.43x" of an earlier stop was the two workers finishing the backlog, not their speed).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402
from kafka import KafkaConsumer, TopicPartition  # noqa: E402

from benchmarks.broker import benchmark_cluster  # noqa: E402
from undertow.rollout.config import rollout_group  # noqa: E402
from undertow.schemas import Task  # noqa: E402
from undertow.streams import KafkaSettings, RecordProducer, Topics, create_topics  # noqa: E402
from undertow.streams.admin import admin_client, partition_count  # noqa: E402

ROLLOUT = {"sampling": {"max_new_tokens": 8, "temperature": 1.0}, "workflow": "single_turn",
           "reward": "numeric_match", "batch_tasks": 4, "workers": 1}


def committed_total(kafka: KafkaSettings, namespace: str, topic: str) -> int:
    """Tasks the rollout group has committed, over every partition of the tasks topic."""
    reader = KafkaConsumer(**kafka.kafka_python(), group_id=rollout_group(namespace), enable_auto_commit=False)
    try:
        return sum(reader.committed(TopicPartition(topic, p)) or 0 for p in range(partition_count(kafka, topic)))
    finally:
        reader.close()


def members(kafka: KafkaSettings, namespace: str) -> int:
    """Members of the rollout group, 0 until it is stable."""
    try:
        with admin_client(kafka) as admin:
            desc = admin.describe_groups([rollout_group(namespace)])[rollout_group(namespace)]
    except Exception:  # noqa: BLE001 — no coordinator yet
        return 0
    return len(desc["members"]) if desc.get("group_state") == "Stable" else 0


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def rate(kafka: KafkaSettings, namespace: str, topic: str, window: float, backlog: int) -> float:
    start, done = time.monotonic(), committed_total(kafka, namespace, topic)
    time.sleep(window)
    now = committed_total(kafka, namespace, topic)
    if now >= backlog:
        raise SystemExit(f"the backlog of {backlog} tasks ran out within the window: raise --tasks")
    return (now - done) / (time.monotonic() - start)


def start_worker(config: Path, name: str, work: Path) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "undertow.infra.cli", "rollout", str(config)], cwd=ROOT, env=env,
                            stdout=open(work / f"{name}.log", "w"), stderr=subprocess.STDOUT)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=40000, help="backlog published before the workers start")
    ap.add_argument("--window", type=float, default=20.0, help="seconds each rate is measured over")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, benchmark_cluster(Path(tmp)) as kafka:
        work, namespace = Path(tmp), f"elastic-{uuid.uuid4().hex[:6]}"
        create_topics(kafka, namespace)
        topics = Topics(namespace)
        with RecordProducer(kafka) as producer:
            for i in range(args.tasks):
                producer.send(topics.tasks, Task(task_id=f"t{i}", prompt=f"What is {i % 9}+1?", answer=str(i % 9 + 1),
                                                 group_size=2), key=f"t{i}")
        config = work / "run.yaml"
        config.write_text(yaml.safe_dump({"namespace": namespace, "model": {"source": "tiny"}, "rollout": ROLLOUT,
                                          "kafka": {"bootstrap_servers": kafka.bootstrap_servers}}))
        workers = [start_worker(config, "a", work)]
        try:
            wait(lambda: committed_total(kafka, namespace, topics.tasks) >= 16, 180, "worker a's first commits")
            one, one_load = rate(kafka, namespace, topics.tasks, args.window, args.tasks), load()
            workers.append(start_worker(config, "b", work))
            wait(lambda: members(kafka, namespace) == 2, 180, "worker b to join the group")
            time.sleep(5)  # b past its model's first calls
            two, two_load = rate(kafka, namespace, topics.tasks, args.window, args.tasks), load()
        finally:
            for w in workers:
                w.send_signal(signal.SIGTERM)
            for w in workers:
                w.wait(60)
        print(f"1 worker: {one:.1f} tasks/s ({one_load})")
        print(f"2 workers (2 processes): {two:.1f} tasks/s ({two_load}); {two / one:.2f}x")


if __name__ == "__main__":
    main()
