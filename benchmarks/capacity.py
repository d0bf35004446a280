"""A capacity model of an undertow run: measured rates and a cluster shape in, trained experiences/s,
trainer idle fraction and mean staleness out (README, "Scaling out").

    python benchmarks/capacity.py --check RUN_DIR [--stage rl]    # predict a finished run from its own
                                                                  # components' rates, print predicted vs measured
    python benchmarks/capacity.py --rollout-workers 8 --gen-per-s 400 --step-s 2.5 --batch 512 ...

The simulation is event by event: each rollout worker generates batches at its measured rate, under
the admission rule of rollout/admission.py (no more than (L + max_staleness + 1) x experiences_per_version
published by trainer version L, never more than max_staleness versions behind), loading a new
version between batches (its swap pause); the processors are one queue served at their measured rate
per worker; the trainer takes `batch` experiences, drops those staler than max_staleness, steps for
its measured step time and announces the version after its measured publish time. Workers beyond
the tasks topic's partitions and processor workers beyond the raw topic's get nothing (idle).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Rates:
    """What the components were measured to do (per worker, per step)."""

    gen_per_s: float  # experiences a rollout worker publishes per second while generating, batch overheads in
    step_s: float  # the trainer's compute per step at `Shape.batch` experiences
    publish_s: float = 0.0  # trainer time per step outside compute and waiting: weights publish, commits, metrics
    weights_delay_s: float = 0.0  # from a step's end until its version is loaded in a worker (transport, checks)
    swap_s: float = 0.0  # a rollout worker's generation pause to load a new version
    process_per_s: float = 6150.0  # one processor worker (benchmarks/README.md: default pipeline, ~1 KB records)
    process_latency_s: float = 0.024  # publish -> ready p50 at 1,000/s (README's benchmarks)


@dataclass
class Shape:
    """The cluster and the run's settings that bound it."""

    rollout_workers: int = 1
    processor_workers: int = 1
    tasks_partitions: int = 4
    raw_partitions: int = 4
    batch: int = 64  # trainer.batching.experiences
    batch_experiences: int = 64  # per rollout batch: rollout.batch_tasks x feeder.group_size
    group_size: int = 8
    max_staleness: int = 2
    experiences_per_version: int | None = 64  # rollout.experiences_per_version (None: no cap)


@dataclass
class Prediction:
    experiences_per_s: float  # trained
    trainer_idle: float  # share of the trainer's wall time spent waiting for a batch
    staleness_mean: float
    stale_dropped: int = 0
    bottleneck: str = ""


@dataclass
class _Worker:
    held: int = 0  # the version it generates with
    latest_seen: int = 0  # the newest announced version it knows
    published: int = 0  # experiences it published over the run (admission's N_r)
    busy: bool = False


def simulate(rates: Rates, shape: Shape, steps: int = 300, jitter: float = 0.5, seed: int = 0) -> Prediction:
    """Run the pipeline for `steps` trainer steps; returns what the trainer saw. Each batch's
    generation time varies uniformly by ±`jitter` around its mean (seeded): with fixed times the
    workers and the trainer fall into one phase and staleness comes out a whole number."""
    return _Simulation(rates, shape, jitter, seed).run(steps)


class _Simulation:
    """The event queue and the state of every worker, the processors and the trainer."""

    def __init__(self, rates: Rates, shape: Shape, jitter: float, seed: int):
        self.rates, self.shape, self.jitter, self.rng = rates, shape, jitter, random.Random(seed)
        self.workers = [_Worker() for _ in range(min(shape.rollout_workers, shape.tasks_partitions))]
        self.process_rate = min(shape.processor_workers, shape.raw_partitions) * rates.process_per_s
        self.events: list[tuple[float, int, str, tuple]] = []  # (time, order, kind, payload)
        self.order = iter(range(1 << 62))
        self.ready: deque[int] = deque()  # policy versions of experiences waiting for the trainer
        self.announced = self.version = self.trained = self.stale = self.staleness_sum = 0
        self.processors_free = self.trainer_free = self.waited = 0.0
        self.ends: list[float] = []  # each step's end: figures count from the first (past the pipeline's fill)

    def push(self, t: float, kind: str, *payload: int) -> None:
        heapq.heappush(self.events, (t, next(self.order), kind, payload))

    def run(self, steps: int) -> Prediction:
        for i in range(len(self.workers)):
            self.start_batch(i, 0.0)
        self.push(0.0, "trainer")
        while self.events and self.version < steps:
            now, _, kind, payload = heapq.heappop(self.events)
            if kind == "generated":  # the batch goes through the processors: one queue at their summed rate
                worker, held, n = payload
                self.workers[worker].busy = False
                self.processors_free = max(self.processors_free, now) + n / self.process_rate
                self.push(self.processors_free + self.rates.process_latency_s, "ready", held, n)
                self.start_batch(worker, now)
            elif kind == "ready":
                self.ready.extend([payload[0]] * payload[1])
                self.push(now, "trainer")
            elif kind == "announce":
                self.announced = payload[0]
                for i in range(len(self.workers)):
                    self.start_batch(i, now)
            elif kind == "trainer" and now >= self.trainer_free:
                self.step(now)
        wall = self.ends[-1] - self.ends[0]
        return Prediction(experiences_per_s=(self.trained - self.shape.batch) / wall, trainer_idle=self.waited / wall,
                          staleness_mean=self.staleness_sum / max(self.trained, 1), stale_dropped=self.stale,
                          bottleneck=bottleneck(self.rates, self.shape))

    def start_batch(self, i: int, now: float) -> None:
        """A worker between batches: load the newest version, then generate if admission lets it."""
        w, shape = self.workers[i], self.shape
        if w.busy:
            return
        w.latest_seen = self.announced
        pause = 0.0
        if w.held < self.announced:  # the newest version, for its swap pause
            w.held, pause = self.announced, self.rates.swap_s
        cap = shape.experiences_per_version
        # AReaL's N_r <= (L + max_staleness + 1) * B, counted over the run (rollout/admission.py)
        allowance = None if cap is None else (self.announced + shape.max_staleness + 1) * cap
        if allowance is not None and w.published >= allowance:
            return  # over-production: wait for the next announced version
        n = shape.batch_experiences
        if cap is not None:  # admission cuts a batch to the room left, whole groups, at least one
            room = allowance - w.published
            n = max(shape.group_size, min(n, math.ceil(room / shape.group_size) * shape.group_size))
        w.busy, w.published = True, w.published + n
        took = n / self.rates.gen_per_s * self.rng.uniform(1 - self.jitter, 1 + self.jitter)
        self.push(now + pause + took, "generated", i, w.held, n)

    def step(self, now: float) -> None:
        """The trainer: drop what is too stale, wait for a whole batch, train it, announce the version."""
        while self.ready and self.version - self.ready[0] > self.shape.max_staleness:
            self.ready.popleft()
            self.stale += 1
        if len(self.ready) < self.shape.batch:
            return  # waits; the next arrival wakes it
        self.waited += max(0.0, now - self.trainer_free) if self.ends else 0.0
        batch = [self.ready.popleft() for _ in range(self.shape.batch)]
        self.staleness_sum += sum(self.version - v for v in batch)
        self.trained += len(batch)
        self.version += 1
        self.trainer_free = now + self.rates.step_s + self.rates.publish_s
        self.ends.append(self.trainer_free)
        self.push(now + self.rates.step_s + self.rates.weights_delay_s, "announce", self.version)
        self.push(self.trainer_free, "trainer")


def bottleneck(rates: Rates, shape: Shape) -> str:
    """The stage with the least capacity in experiences/s (before staleness and admission)."""
    capacity = {
        "rollout": min(shape.rollout_workers, shape.tasks_partitions) * rates.gen_per_s,
        "processors": min(shape.processor_workers, shape.raw_partitions) * rates.process_per_s,
        "trainer": shape.batch / (rates.step_s + rates.publish_s),
    }
    return min(capacity, key=capacity.get)


@dataclass
class Measured:
    """A finished run's figures, from its metrics.jsonl (one stage)."""

    rates: Rates
    shape: Shape
    outcome: Prediction
    steps: int
    notes: dict = field(default_factory=dict)


def from_run(run_dir: Path, stage: str = "rl") -> Measured:
    """The components' rates of a finished run (inputs) and its system figures (to predict)."""
    import yaml

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r.get("stage", "main") == stage]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    section = next((s for s in config.get("run", {}).get("stages", []) if s["name"] == stage), {})
    merged = {k: {**config.get(k, {}), **section.get(k, {})} for k in ("feeder", "rollout", "trainer")}
    group = merged["feeder"].get("group_size", 1)
    trainer = [r for r in rows if r["component"] == "trainer" and "step_s" in r]
    rollout = [r for r in rows if r["component"].startswith("rollout") and "batch_tasks" in r]
    # A batch's generation time: the gap to the same worker's previous batch. Admission waits make
    # some gaps long, so the median gap is the worker's pace while it works.
    paces = [b["batch_tasks"] * group / (b["time"] - a["time"]) for a, b in zip(rollout, rollout[1:])
             if a["component"] == b["component"] and b["time"] > a["time"]]
    # Trainer time between two steps that is neither compute nor waiting: publishing, commits, metrics.
    gaps = [b["time"] - a["time"] - b["step_s"] - b["wait_s"] for a, b in zip(trainer, trainer[1:])]
    swaps = [r for r in rows if "weight_swap_s" in r]
    # A version's way to the workers: from the trainer's event for step v to a worker's swap to v.
    stepped = {r["step"]: r["time"] for r in trainer}
    delays = [r["time"] - stepped[r["step"]] for r in swaps if r["step"] in stepped]
    rates = Rates(gen_per_s=statistics.median(paces), step_s=statistics.mean(r["step_s"] for r in trainer),
                  publish_s=max(0.0, statistics.mean(gaps)),
                  weights_delay_s=statistics.median(delays) if delays else 0.0,
                  swap_s=statistics.mean(r["weight_swap_s"] for r in swaps) if swaps else 0.0)
    batching = merged["trainer"].get("batching", {})
    # Batches are often smaller than rollout.batch_tasks (a poll returns what the feeder has put there,
    # admission cuts to its room): the measured mean is what the worker really hands on at a time.
    tasks = round(statistics.mean(r["batch_tasks"] for r in rollout))
    shape = Shape(rollout_workers=merged["rollout"].get("workers", 1), batch=batching.get("experiences", 64),
                  batch_experiences=tasks * group, group_size=group,
                  max_staleness=batching.get("max_staleness", 1),
                  experiences_per_version=merged["rollout"].get("experiences_per_version"))
    # From the end of the first step (past start-up and the pipeline's fill) to the end of the last.
    wall = trainer[-1]["time"] - trainer[0]["time"]
    records = sum(r["records"] for r in trainer)
    outcome = Prediction(experiences_per_s=(records - trainer[0]["records"]) / wall,
                         trainer_idle=sum(r["wait_s"] for r in trainer[1:]) / wall,
                         staleness_mean=sum(r["staleness_mean"] * r["records"] for r in trainer) / records)
    return Measured(rates, shape, outcome, len(trainer), {"wall_s": wall, "records": records})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", type=Path, help="a finished run directory: predict it, print predicted vs measured")
    parser.add_argument("--stage", default="rl")
    for name, default in (("rollout-workers", 1), ("processor-workers", 1), ("tasks-partitions", 4),
                          ("raw-partitions", 4), ("batch", 64), ("batch-experiences", 64), ("group-size", 8),
                          ("max-staleness", 2), ("steps", 300)):
        parser.add_argument(f"--{name}", type=int, default=default)
    for name, default in (("gen-per-s", 100.0), ("step-s", 0.5), ("publish-s", 0.0), ("weights-delay-s", 0.0),
                          ("swap-s", 0.0), ("process-per-s", 6150.0)):
        parser.add_argument(f"--{name}", type=float, default=default)
    args = parser.parse_args()
    if args.check:
        run = from_run(args.check, args.stage)
        predicted = simulate(run.rates, run.shape, run.steps)
        print(json.dumps({"rates": asdict(run.rates), "shape": asdict(run.shape), "steps": run.steps, **run.notes},
                         indent=1))
        for name in ("experiences_per_s", "trainer_idle", "staleness_mean"):
            p, m = getattr(predicted, name), getattr(run.outcome, name)
            print(f"{name:>18}: predicted {p:8.3f}  measured {m:8.3f}  ({(p - m) / m:+.0%})")
        print(f"bottleneck: {predicted.bottleneck}")
        return
    rates = Rates(gen_per_s=args.gen_per_s, step_s=args.step_s, publish_s=args.publish_s,
                  weights_delay_s=args.weights_delay_s, swap_s=args.swap_s, process_per_s=args.process_per_s)
    shape = Shape(rollout_workers=args.rollout_workers, processor_workers=args.processor_workers,
                  tasks_partitions=args.tasks_partitions, raw_partitions=args.raw_partitions, batch=args.batch,
                  batch_experiences=args.batch_experiences, group_size=args.group_size,
                  max_staleness=args.max_staleness)
    print(json.dumps(asdict(simulate(rates, shape, args.steps)), indent=1))


if __name__ == "__main__":
    main()
