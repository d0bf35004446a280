"""End-to-end latency, rollout publish -> trainer-ready, through one processor worker: p50 / p99.

    python benchmarks/e2e_latency.py [--rate 500] [--seconds 20]

A LocalKafka of its own (unless $UNDERTOW_BOOTSTRAP names a cluster), a fresh namespace, one
`undertow process` worker running the demo's RL pipeline (examples/demo.yaml: clean, reshape grpo,
prioritize) and, in this process, the trainer's intake: trainer.ready_intake.ReadyIntake built as trainer/runner.py
builds it, from the demo's trainer section. Demo-sized groups of 8 go to experiences.raw at `--rate`
experiences/s the way a rollout worker sends them: a group's samples back to back, then a flush.
An experience is trainer-ready when the ReadyIntake has put its completed group into its window (a batch
could be formed from it); latency = that moment - the moment the experience was sent (time.time(),
one clock: publisher and ReadyIntake share this process).

Group assembly (the processors' reshape, then the ReadyIntake) waits for the last sample of a group, so a
sample's latency includes publishing the rest of its group. Each group's last sample is reported
too: its latency is the pipeline's alone. The worker's "processed" stamp splits the latency into
worker and trainer intake; the worker's scheduler counters say how long it ran and how long it
waited for a CPU (much waiting: the machine, not the worker, set the pace; past the rate one worker
sustains, latency is queueing and grows with --seconds).

Reference, measured in the same run on the same broker: a plain kafka-python producer -> consumer
moving the same bytes at the same rate, keyed and flushed the same way, on a topic with the same
partitions; a group counts as received when its last record is. Ratios are undertow / reference.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Callable

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kafka import KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402

from undertow.infra.broker.local import LocalKafka, free_port_block  # noqa: E402
from undertow.schemas import Experience, encode  # noqa: E402
from undertow.streams import KafkaSettings, RecordProducer, Topics, create_topics  # noqa: E402
from undertow.trainer.config import TrainerConfig  # noqa: E402
from undertow.trainer.ready_intake import ReadyIntake  # noqa: E402
from undertow.trainer.objectives import objectives  # noqa: E402

GROUP = 8
Message = tuple[str, bytes]  # (group id = key, encoded experience); the id is "<group id>/<sample index>"
Send = Callable[[str, bytes], None]
Poll = Callable[[dict[str, float]], None]  # poll once; record arrival times by experience id


def demo_group(prefix: str, g: int) -> list[Message]:
    """One "a+b=" task's group as the demo's rollout publishes it (character tokens, <= 4 new tokens)."""
    a, b = g % 10, g * 7 % 10
    prompt, now = f"{a}+{b}=", time.time()
    group = f"{prefix}{g}"
    out = []
    for i in range(GROUP):
        right = i % 3 != 0  # mixed rewards: grpo gets a group with a learning signal
        answer = str(a + b if right else a + b + 1)
        tokens = [ord(c) for c in answer] + [0]  # + EOS
        exp = Experience(experience_id=f"{group}/{i}", task_id=group, group_id=group, group_size=GROUP,
                         sample_index=i, prompt_text=prompt, prompt_tokens=[ord(c) for c in prompt],
                         response_text=answer, response_tokens=tokens, behaviour_logprobs=[-0.7] * len(tokens),
                         loss_mask=[1] * len(tokens), reward=float(right), reward_components={"correct": float(right)},
                         policy_version=0, finish_reason="stop", timestamps={"created": now, "generated": now},
                         metadata={"taskset": "sums", "worker": "rollout-0"})
        out.append((group, encode(exp)))
    return out


def publish(send: Send, flush: Callable[[], None], groups: list[list[Message]], rate: float,
            sent: dict[str, float]) -> None:
    """Group after group at `rate` experiences/s; each group sent back to back, then flushed (as rollout commits)."""
    t0 = time.time()
    for n, group in enumerate(groups):
        delay = t0 + n * GROUP / rate - time.time()
        if delay > 0:
            time.sleep(delay)
        for i, (key, value) in enumerate(group):
            sent[f"{key}/{i}"] = time.time()
            send(key, value)
        flush()


def run_phase(send: Send, flush: Callable[[], None], poll: Poll, groups: list[list[Message]], rate: float,
              grace_s: float = 60.0) -> tuple[dict[str, float], dict[str, float]]:
    """Publish `groups` from a thread while polling here; returns (sent, ready) times by experience id."""
    sent: dict[str, float] = {}
    ready: dict[str, float] = {}
    sender = threading.Thread(target=publish, args=(send, flush, groups, rate, sent))
    sender.start()
    deadline = time.time() + len(groups) * GROUP / rate + grace_s
    while time.time() < deadline and (sender.is_alive() or not sent.keys() <= ready.keys()):
        poll(ready)
    sender.join()
    return sent, {k: v for k, v in ready.items() if k in sent}


def intake_poll(intake: ReadyIntake, cfg: TrainerConfig, processed: dict[str, float]) -> Poll:
    """One ReadyIntake.fill; whatever completed groups reach the window are trainer-ready now, then taken out.
    `processed` gets the worker's "processed" stamp of each, to split the latency in two."""
    def poll(ready: dict[str, float]) -> None:
        intake.fill(0, cfg.poll_timeout_ms)
        now = time.time()  # at most one poll's admission work after the put
        while len(intake.window):
            for group in intake.window.take(cfg.batching.experiences, cfg.batching.token_budget):
                for item in group.items:
                    ready[item.record_id] = now
                    processed[item.record_id] = item.record.timestamps["processed"]
    return poll


def raw_poll(consumer: KafkaConsumer) -> Poll:
    """Plain consumer: a group's records share a key and a partition, in order, so the n-th with key k is k/n."""
    seen: Counter[str] = Counter()

    def poll(ready: dict[str, float]) -> None:
        batches = consumer.poll(timeout_ms=200)
        now = time.time()
        for messages in batches.values():
            for m in messages:
                key = m.key.decode()
                ready[f"{key}/{seen[key]}"] = now
                seen[key] += 1
    return poll


def figures(sent: dict[str, float], ready: dict[str, float]) -> dict[str, float]:
    """p50 / p99 in ms per experience, and per group (its last sample's send -> the group complete)."""
    per_record = [ready[k] - sent[k] for k in ready]
    groups: dict[str, list[str]] = {}
    for k in sent:
        groups.setdefault(k.rsplit("/", 1)[0], []).append(k)
    per_group = [max(ready[k] for k in ks) - max(sent[k] for k in ks)
                 for ks in groups.values() if all(k in ready for k in ks)]
    pct = lambda xs, q: 1000 * statistics.quantiles(xs, n=100)[q - 1]  # noqa: E731
    span = max(sent.values()) - min(sent.values())
    return {"sent": len(sent), "rate": len(sent) / max(span, 1e-9), "missing": len(sent) - len(ready),
            "p50": pct(per_record, 50), "p99": pct(per_record, 99),
            "group_p50": pct(per_group, 50), "group_p99": pct(per_group, 99)}


def sched_s(pid: int) -> tuple[float, float]:
    """Seconds the process's main thread has run on a CPU, and waited runnable for one (the Faust loop
    is that thread): much waiting means the machine, not the worker, set the pace."""
    on_cpu, waiting, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
    return int(on_cpu) / 1e9, int(waiting) / 1e9


def start_worker(kafka: KafkaSettings, ns: str, demo: dict, tmp: Path) -> subprocess.Popen:
    """`undertow process` on the demo's processors section, in this namespace."""
    config = tmp / "processors.yaml"
    processors = {**demo["processors"], "app_id": f"bench-{ns}"}
    config.write_text(yaml.safe_dump({"namespace": ns, "kafka": {"bootstrap_servers": kafka.bootstrap_servers},
                                      "processors": processors}))
    with open(tmp / "worker.log", "wb") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", "undertow.infra.cli", "process", str(config)], cwd=ROOT,
                                env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=log, stderr=subprocess.STDOUT)


def stop(worker: subprocess.Popen, timeout_s: float = 60.0) -> None:
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(timeout_s)
    except subprocess.TimeoutExpired:  # a hung shutdown must not outlive the benchmark
        worker.kill()
        worker.wait()


def wait_first_group(producer: RecordProducer, topic: str, poll: Poll, worker: subprocess.Popen, log: Path,
                     timeout_s: float = 300.0) -> None:
    """One group every second until one comes out of the worker (it takes a while to start and join)."""
    ready: dict[str, float] = {}
    deadline = time.time() + timeout_s
    g = 0
    while not ready:
        if time.time() > deadline or worker.poll() is not None:
            raise RuntimeError(f"the processor worker delivered nothing (exit code {worker.poll()}); "
                               f"its log ends:\n{log.read_text(errors='replace')[-2000:]}")
        for key, value in demo_group("first-", g):
            producer.send_bytes(topic, value, key=key)
        producer.flush()
        g += 1
        until = time.time() + 1.0
        while time.time() < until and not ready:
            poll(ready)


def measure_undertow(kafka: KafkaSettings, demo: dict, args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    create_topics(kafka, ns)
    topics = Topics(ns)
    cfg = TrainerConfig.model_validate(demo["trainer"])
    objective = objectives.get(cfg.algorithm.objective)(cfg.algorithm)
    worker = start_worker(kafka, ns, demo, tmp)
    producer, publisher = RecordProducer(kafka), RecordProducer(kafka)
    intake = ReadyIntake(kafka, topics, cfg.batching, group_id=cfg.consumer_group, record_type=objective.record_type,
                         checks_staleness=objective.checks_staleness, producer=producer, start={}, trained_ids=[],
                         seed=cfg.engine.seed)
    processed: dict[str, float] = {}
    try:
        poll = intake_poll(intake, cfg, processed)
        wait_first_group(publisher, topics.raw, poll, worker, tmp / "worker.log")
        send = lambda key, value: publisher.send_bytes(topics.raw, value, key=key)  # noqa: E731
        (cpu, waited), wall = sched_s(worker.pid), time.monotonic()
        sent, ready = phases(send, publisher.flush, poll, args)
        (cpu_end, waited_end), wall = sched_s(worker.pid), time.monotonic() - wall
        worker_part = figures(sent, {k: processed[k] for k in ready})
        return {**figures(sent, ready), "worker_p50": worker_part["p50"], "worker_p99": worker_part["p99"],
                "worker_cpu": (cpu_end - cpu) / wall, "worker_waiting": (waited_end - waited) / wall}
    finally:
        intake.close()
        publisher.close()
        producer.close()
        stop(worker)


def measure_reference(kafka: KafkaSettings, args: argparse.Namespace) -> dict[str, float]:
    ns = f"bench-{uuid.uuid4().hex[:6]}-ref"
    create_topics(kafka, ns)
    topic = Topics(ns).raw  # the same partitions and configs as experiences.raw
    producer = KafkaProducer(**kafka.kafka_python(), acks="all", linger_ms=5)
    consumer = KafkaConsumer(**kafka.kafka_python(), group_id=None, enable_auto_commit=False)
    consumer.assign([TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))])
    consumer.seek_to_beginning()
    try:
        send = lambda key, value: producer.send(topic, value=value, key=key.encode())  # noqa: E731
        return figures(*phases(send, producer.flush, raw_poll(consumer), args))
    finally:
        consumer.close()
        producer.close()


def phases(send: Send, flush: Callable[[], None], poll: Poll,
           args: argparse.Namespace) -> tuple[dict[str, float], dict[str, float]]:
    """A discarded warm-up at the rate, then the measured run: its (sent, ready) times."""
    per_s = args.rate / GROUP
    run_phase(send, flush, poll, [demo_group("warm-", g) for g in range(int(per_s * args.warmup_seconds))], args.rate)
    groups = [demo_group("g", g) for g in range(int(per_s * args.seconds))]
    return run_phase(send, flush, poll, groups, args.rate)


def report(ours: dict[str, float], ref: dict[str, float], args: argparse.Namespace) -> None:
    size = len(demo_group("g", 0)[0][1])
    print(f"{ours['sent']} experiences ({size} bytes each, groups of {GROUP}) at {args.rate:g}/s (reached: "
          f"undertow {ours['rate']:.0f}/s, reference {ref['rate']:.0f}/s); never ready: undertow {ours['missing']}, "
          f"reference {ref['missing']}")
    for label, f in (("undertow publish -> trainer-ready", ours), ("reference producer -> consumer", ref)):
        print(f"{label:34s} per experience p50 {f['p50']:7.1f} ms  p99 {f['p99']:7.1f} ms   "
              f"per group (last sample) p50 {f['group_p50']:7.1f} ms  p99 {f['group_p99']:7.1f} ms")
    print(f"  of which publish -> processed (the worker's stamp): p50 {ours['worker_p50']:.1f} ms, "
          f"p99 {ours['worker_p99']:.1f} ms; the worker ran {ours['worker_cpu']:.0%} of the time and "
          f"waited for a CPU {ours['worker_waiting']:.0%}")
    ratio = {k: ours[k] / max(ref[k], 1e-9) for k in ("p50", "p99", "group_p50", "group_p99")}
    print(f"ratio undertow / reference: per experience p50 {ratio['p50']:.1f}x, p99 {ratio['p99']:.1f}x; "
          f"per group p50 {ratio['group_p50']:.1f}x, p99 {ratio['group_p99']:.1f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=500.0, help="experiences/s published")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of the measured run")
    ap.add_argument("--warmup-seconds", type=float, default=3.0, help="published at the rate first, not measured")
    args = ap.parse_args()
    demo = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        broker = None
        if not os.environ.get("UNDERTOW_BOOTSTRAP"):
            broker = LocalKafka(Path(tmp) / "kafka", port=free_port_block(2)).start()
        kafka = KafkaSettings(bootstrap_servers=broker.bootstrap_servers) if broker else KafkaSettings().with_env()
        try:
            ours = measure_undertow(kafka, demo, args, Path(tmp))
            ref = measure_reference(kafka, args)
        finally:
            if broker:
                broker.stop()
    report(ours, ref, args)


if __name__ == "__main__":
    main()
