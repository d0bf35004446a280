"""The trainer's throughput with three watchers reading beside it, against the same training without.

    python benchmarks/watchers_overhead.py [--steps 30] [--batch 32] [--raw 20000] [--repeats 2]

Each arm is a fresh namespace: `--steps` batches of tiny-model experiences on the ready topic and
`--raw` experiences on the raw topic, then the real `undertow train --max-steps` on them. In the
watched arm `undertow watch` runs three watchers meanwhile, each its own consumer group on a topic of
its own: response_length (raw), stale_fraction (ready + rejected), entropy_collapse (metrics). Arms
alternate (without, with, …) so drift on a shared machine hits both; prints training tokens/s per
arm (the trainer's own `tokens_per_s`, first step left out) and the ratio of the medians, with / without.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from benchmarks.broker import benchmark_cluster  # noqa: E402
from benchmarks.trainer_throughput import experiences  # noqa: E402
from undertow.schemas import MetricEvent, decode  # noqa: E402
from undertow.streams import KafkaSettings, RecordProducer, Topics, create_topics  # noqa: E402
from undertow.streams.consumer import read_to_end  # noqa: E402

WATCHERS = ["response_length", "stale_fraction", "entropy_collapse"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def load_topics(settings: KafkaSettings, topics: Topics, args: argparse.Namespace) -> None:
    """Ready batches for the trainer, and a raw backlog for the raw topic's watcher to chew through."""
    groups = args.batch // 8
    with RecordProducer(settings) as producer:
        for step in range(args.steps):
            for r in experiences(groups, 8, 32, 96):
                r = r.model_copy(update={"experience_id": f"s{step}/{r.experience_id}", "group_id": f"s{step}/{r.group_id}"})
                producer.send(topics.ready, r, key=r.group_id)
        raw = experiences(args.raw // 8, 8, 32, 96)
        for r in raw:
            producer.send(topics.raw, r, key=r.group_id)


def arm(settings: KafkaSettings, tmp: Path, args: argparse.Namespace, watched: bool) -> float:
    """Training tokens/s of one run of `undertow train`, with `undertow watch` beside it or not."""
    namespace = f"bench-watch-{uuid.uuid4().hex[:6]}"
    topics = Topics(namespace)
    create_topics(settings, namespace)
    load_topics(settings, topics, args)
    config = tmp / f"{namespace}.yaml"
    config.write_text(yaml.safe_dump({
        "namespace": namespace, "kafka": {"bootstrap_servers": settings.bootstrap_servers},
        "model": {"source": "tiny"}, "watchers": WATCHERS,
        "trainer": {"batching": {"experiences": args.batch, "max_staleness": 10_000},
                    "checkpoint_dir": str(tmp / "ckpt"), "checkpoint_every": 100_000}}))
    cli = [sys.executable, "-m", "undertow.infra.cli"]
    watch = subprocess.Popen([*cli, "watch", str(config)], cwd=ROOT, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True) if watched else None
    try:
        if watch:
            time.sleep(5)  # the watchers join their groups and start reading the backlog
        done = subprocess.run([*cli, "train", str(config), "--max-steps", str(args.steps)], cwd=ROOT, env=ENV,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"trainer failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    finally:
        if watch:
            watch.send_signal(signal.SIGTERM)
            print("    " + "\n    ".join(line for line in watch.communicate(timeout=60)[0].splitlines()
                                         if line.startswith("watcher ")))
    steps = [m.values for m in (decode(v, expect=MetricEvent) for v in read_to_end(settings, topics.metrics))
             if m.component == "trainer" and "tokens_per_s" in m.values]
    return statistics.mean(s["tokens_per_s"] for s in steps[1:])  # the first step pays for warm-up


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--batch", type=int, default=32, help="experiences a step (a multiple of 8)")
    ap.add_argument("--raw", type=int, default=20_000, help="raw experiences for the raw topic's watcher")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args()
    rates: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as tmp, benchmark_cluster(Path(tmp)) as settings:
        for _ in range(args.repeats):
            for watched in (False, True):
                rates[watched].append(arm(settings, Path(tmp), args, watched))
                print(f"  {'with' if watched else 'without'} watchers: {rates[watched][-1]:,.0f} training tokens/s",
                      flush=True)
    without, with_ = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"tiny model, {args.batch} x 128 tokens a step, {args.steps} steps; watchers {', '.join(WATCHERS)}: "
          f"{with_:,.0f} vs {without:,.0f} training tokens/s (with / without {with_ / without:.3f})")


if __name__ == "__main__":
    main()
