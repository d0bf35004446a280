"""SmolLM2-135M trained through the broker on this machine: `undertow train` on 64 experiences of
256 tokens a step, in micro-batches with gradient checkpointing.

    python benchmarks/smollm2_broker_train.py [--rows 64] [--tokens 256] [--micro-rows 8] [--steps 1]

The experiences are synthetic (SmolLM2's vocabulary, advantages ±1) and go to the ready topic of
a fresh namespace; the trainer is the real command, as `undertow run` starts it. Prints the step
time, training tokens/s, the trainer's peak RSS and the ledger's count (each id once). A LocalKafka
of its own is started unless $UNDERTOW_BOOTSTRAP names a cluster.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from benchmarks.trainer_memory import experiences  # noqa: E402
from benchmarks.broker import benchmark_cluster  # noqa: E402
from undertow.schemas import MetricEvent, decode  # noqa: E402
from undertow.streams import KafkaSettings, RecordProducer, Topics, create_topics  # noqa: E402
from undertow.streams.consumer import read_to_end  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--micro-rows", type=int, default=8)
    ap.add_argument("--steps", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, benchmark_cluster(Path(tmp)) as settings:
        run(settings, Path(tmp), args)


def run(settings: KafkaSettings, tmp: Path, args: argparse.Namespace) -> None:
    namespace = f"bench-smollm2-{uuid.uuid4().hex[:6]}"
    topics = Topics(namespace)
    create_topics(settings, namespace)
    records = [r.model_copy(update={"experience_id": f"s{step}/{r.experience_id}", "group_id": f"s{step}/{r.group_id}"})
               for step in range(args.steps) for r in experiences(args.rows, args.tokens)]
    with RecordProducer(settings) as producer:
        for r in records:
            producer.send(topics.ready, r, key=r.group_id)
    config = tmp / "run.yaml"
    config.write_text(yaml.safe_dump({
        "namespace": namespace, "kafka": {"bootstrap_servers": settings.bootstrap_servers},
        "model": {"name": "smollm2-135m", "source": "gguf"},
        "trainer": {"engine": {"lr": 1e-6}, "batching": {"experiences": args.rows, "max_staleness": 100},
                    "micro_batch_tokens": args.micro_rows * args.tokens, "gradient_checkpointing": True,
                    "checkpoint_dir": str(tmp / "ckpt"), "checkpoint_every": 1000}}))
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "undertow.infra.cli", "train", str(config), "--max-steps", str(args.steps)],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "2"})
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"trainer failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    peak_gb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1e6
    metrics = [m.values for m in (decode(v, expect=MetricEvent) for v in read_to_end(settings, topics.metrics))
               if m.component == "trainer"]
    ledger = [json.loads(line) for line in (tmp / "ckpt" / namespace / "ledger.jsonl").read_text().splitlines()]
    ids = [i for entry in ledger for i in entry["ids"]]
    print(f"SmolLM2-135M through the broker, {args.rows} x {args.tokens} tokens a step, micro-batches of "
          f"{args.micro_rows} rows, gradient checkpointing, 2 threads")
    for m in metrics:
        print(f"  step {m['version']:.0f}: {m['step_s']:.1f} s, {m['tokens_per_s']:,.0f} training tokens/s, "
              f"loss {m['loss']:.4f}, grad norm {m.get('grad_norm', float('nan')):.3f}, updates {m['updates']:.0f}")
    print(f"  trainer process: {wall:.0f} s wall (model load, step, checkpoint, export), peak RSS {peak_gb:.2f} GB; "
          f"ledger: {len(ids)} ids, {len(set(ids))} distinct (of {len(records)} published)")


if __name__ == "__main__":
    main()
