"""Chaos soak: the demo's RL loop on 3 brokers while components die, a broker bounces and poison flows.

    python benchmarks/chaos_soak.py                      # 15 minutes of chaos
    python benchmarks/chaos_soak.py --minutes 3 --components processors --kills 5   # the CI version

After the demo's SFT warm-up, for `--minutes` of the RL stage: SIGKILL a random component
(`--components`, its whole process group, as if its machine died) every 20-40 s, kill one of the
3 brokers every `--broker-every-s` and bring it back `--broker-down-s` later, and send poison
records (undecodable bytes, a wrong schema version, invalid fields, another kind) onto
experiences.raw from a plain producer at `--poison` of the raw traffic; at `--damage-checkpoint-at` of the
time, truncate the trainer's newest checkpoint and SIGKILL it (it must fall back to the previous one).
`--brokers 1` makes a broker's kill an outage of the whole cluster (the CI version: 120 s). Then the chaos stops, the
feeder is stopped cleanly, the run drains and ends, and the books are checked (tests/audit.py):
published / trained / rejected by reason / lost / trained twice / tasks missing, restarts per
component, the seconds of training progress each fault cost, and the reward before and after. Exits 1 if anything was lost, trained twice or missing,
or if the run did not finish.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import msgpack
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kafka import KafkaConsumer, KafkaProducer, TopicPartition  # noqa: E402

from tests.audit import audit  # noqa: E402
from undertow.infra.broker.local import LocalKafka, free_port_block  # noqa: E402
from undertow.infra.report.metrics_log import read_metrics  # noqa: E402
from undertow.schemas import SCHEMA_VERSION, Task, encode  # noqa: E402
from undertow.streams import KafkaSettings, Topics  # noqa: E402

NAMESPACE = "soak"
STAGE = "rl"  # the stage under chaos
COMPONENTS = ("rollout", "processors", "trainer", "feeder")
POISON = (b"\xc1 not msgpack at all",
          msgpack.packb({"kind": "experience", "schema_version": SCHEMA_VERSION + 98, "experience_id": "p"}),
          msgpack.packb({"kind": "experience", "schema_version": SCHEMA_VERSION, "experience_id": "poison/x"}),
          encode(Task(task_id="poison/task@0", prompt="1+1=")))


@dataclass
class Chaos:
    """What was done to the run."""

    kills: dict[str, int] = field(default_factory=dict)
    broker_kills: int = 0
    checkpoints_damaged: int = 0
    disk_fills: int = 0
    poison_sent: int = 0
    raw_seen: int = 0
    chaos_s: float = 0.0
    events: list = field(default_factory=list)  # (wall time, what): each fault, for what it cost in progress


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="chaos-soak-"))
    cluster = LocalKafka(work / "cluster", port=free_port_block(2 * args.brokers), nodes=args.brokers, heap="384m").start()
    kafka = KafkaSettings(bootstrap_servers=cluster.bootstrap_servers)
    disk = SmallDisk(work / "archive-disk") if args.fill_disk_at >= 0 else None
    cfg = run_config(args)
    if disk is not None and disk.mounted:
        cfg["archive"] = {**cfg.get("archive", {}), "root": str(disk.path / "archive")}
    proc = start_run(cfg, work, cluster.bootstrap_servers)
    chaos = Chaos()
    try:
        run_dir = wait_for_rl(proc, work / "runs", min_step=args.before_steps)
        before_step = trainer_step(run_dir)
        with PoisonFeed(kafka, args.poison, args.seed, chaos):
            make_chaos(run_dir, cluster, args, chaos, proc, disk if disk is not None and disk.mounted else None)
        if proc.poll() is None:  # else the run failed under the chaos: report how far it got
            time.sleep(args.settle_s)  # restarts in backoff come back before the feeder is stopped
            stop_feeder(run_dir, proc)
        proc.wait(timeout=args.drain_timeout_s)
        result = report(kafka, run_dir, chaos, before_step, proc.returncode)
    finally:
        stop_run(proc)  # a soak that failed half-way must not leave its run behind
        cluster.stop()
        if disk is not None:
            disk.close()
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    ok = result["run_status"] == "done" and not (result["lost"] or result["trained_twice"] or result["tasks_missing"])
    return 0 if ok else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=15.0, help="how long the chaos lasts")
    p.add_argument("--kill-every-s", type=float, nargs=2, default=(20.0, 40.0), metavar=("MIN", "MAX"),
                   help="seconds between component kills, drawn uniformly")
    p.add_argument("--components", default=",".join(COMPONENTS), help="comma-separated components to kill")
    p.add_argument("--kills", type=int, default=None, help="stop killing after this many (default: no limit)")
    p.add_argument("--broker-every-s", type=float, default=200.0, help="seconds between broker kills (0: none)")
    p.add_argument("--broker-down-s", type=float, default=30.0, help="how long a killed broker stays down")
    p.add_argument("--broker-bounces", type=int, default=None, help="stop bouncing brokers after this many "
                   "(default: no limit); with --kills, the chaos ends once both are done")
    p.add_argument("--brokers", type=int, default=3, help="brokers in the cluster (1: a broker's outage stops "
                   "every component until it is back)")
    p.add_argument("--damage-checkpoint-at", type=float, default=0.5, help="when (a fraction of --minutes) to "
                   "truncate the trainer's newest checkpoint and SIGKILL it: it must fall back (negative: never)")
    p.add_argument("--fill-disk-at", type=float, default=0.3, help="when (a fraction of --minutes) to fill the "
                   "archive's disk (a small tmpfs: needs root; negative: never)")
    p.add_argument("--fill-disk-s", type=float, default=30.0, help="how long the archive's disk stays full")
    p.add_argument("--poison", type=float, default=0.10, help="poison records per record of raw traffic")
    p.add_argument("--before-steps", type=int, default=10, help="RL steps before the chaos starts ('before' reward)")
    p.add_argument("--settle-s", type=float, default=40.0, help="wait after the chaos before stopping the feeder")
    p.add_argument("--drain-timeout-s", type=float, default=600.0, help="longest wait for the run to end")
    p.add_argument("--restart-max", type=int, default=10,
                   help="run.restarts.max of the run (600 s window). A kill every 30 s among 4 components is "
                        "5 per component per 10 minutes on average, the default policy's limit: a soak that "
                        "keeps the default fails by chance (once: the trainer's 6th kill in 290 s)")
    p.add_argument("--default-policy", action="store_true", help="keep the default run.restarts instead")
    p.add_argument("--init-from", help="an HF export of the demo's SFT warm-up (e.g. a demo run's "
                   "checkpoints/demo-warmup/step-*/hf): RL starts from it instead of running the warm-up first")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workdir", help="where the cluster and the run go (default: a new temporary directory)")
    p.add_argument("--json", help="also write the figures to this file")
    return p.parse_args(argv)


def run_config(args: argparse.Namespace) -> dict:
    """The demo (SFT warm-up, then RL) on a finite taskset larger than the soak will use."""
    cfg = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    cfg["namespace"] = NAMESPACE
    warmup, rl = cfg["run"]["stages"]
    assert rl["name"] == STAGE
    if args.init_from:
        cfg["run"]["stages"] = [rl]
        cfg["model"]["init_from"] = args.init_from
    rl.update(steps=1_000_000, feeder={"epochs": 1})  # it ends when the feeder is stopped and all is trained
    cfg["run"].update(name="soak", idle_timeout_s=25)
    if not args.default_policy:
        cfg["run"]["restarts"] = {"max": args.restart_max}
    cfg["trainer"]["checkpoint_every"] = 10  # a killed trainer resumes from a checkpoint 0-9 steps back
    # Partial groups (a sample lost to a kill) are released within 10 + 10 s (as in tests/faults/).
    cfg["processors"]["group_timeout_s"] = 10
    cfg["trainer"]["batching"]["group_timeout_s"] = 10
    return cfg


def start_run(cfg: dict, work: Path, bootstrap: str) -> subprocess.Popen:
    path = work / "soak.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "UNDERTOW_BOOTSTRAP": bootstrap}
    log = open(work / "run.out", "w")
    return subprocess.Popen([sys.executable, "-m", "undertow.infra.cli", "run", str(path), "--runs-dir", str(work / "runs"),
                             "--no-live"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, text=True, env=env)


def stop_run(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()


def trainer_rows(run_dir: Path) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl")
            if r.get("stage") == STAGE and r["component"] == "trainer" and "reward_mean" in r]


def trainer_step(run_dir: Path) -> int:
    return int(max((r["version"] for r in trainer_rows(run_dir)), default=0))


def wait_for_rl(proc: subprocess.Popen, runs: Path, min_step: int, timeout: float = 900) -> Path:
    """The run directory, once the RL stage's trainer has reported `min_step`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"undertow run exited with {proc.returncode} before the RL stage")
        for run_dir in runs.glob("*"):
            if trainer_step(run_dir) >= min_step:
                return run_dir
        time.sleep(1)
    raise TimeoutError(f"the RL stage did not reach step {min_step}")


def pid_of(run_dir: Path, name: str) -> int | None:
    try:
        (logs,) = run_dir.glob(f"logs/*-{STAGE}")  # 1-rl after the warm-up, 0-rl with --init-from
        pid = int((logs / f"{name}.pid").read_text())
        os.kill(pid, 0)
        return pid
    except (OSError, ValueError):
        return None  # not started, or dead and waiting out its backoff


def make_chaos(run_dir: Path, cluster: LocalKafka, args: argparse.Namespace, chaos: Chaos,
               proc: subprocess.Popen, disk: "SmallDisk | None" = None) -> None:
    """Kill components and bounce brokers until the time is up (or the kills are done)."""
    rng = random.Random(args.seed)
    names = [n.strip() for n in args.components.split(",") if n.strip()]
    started = time.monotonic()
    end = started + args.minutes * 60
    next_kill = started + rng.uniform(*args.kill_every_s)
    next_broker = started + args.broker_every_s if args.broker_every_s > 0 else float("inf")
    down: tuple[int, float] | None = None  # (node, when it comes back)
    damage_at = started + args.damage_checkpoint_at * args.minutes * 60 if args.damage_checkpoint_at >= 0 else float("inf")
    fill_at = started + args.fill_disk_at * args.minutes * 60 if disk is not None else float("inf")
    free_at = float("inf")
    while time.monotonic() < end and proc.poll() is None:
        now = time.monotonic()
        if now >= fill_at:
            taken = disk.fill()
            chaos.disk_fills += 1
            chaos.events.append((time.time(), f"archive disk full {args.fill_disk_s:.0f} s"))
            print(f"[chaos {now - started:5.0f}s] filled the archive's disk ({taken >> 20} MiB)", flush=True)
            fill_at, free_at = float("inf"), now + args.fill_disk_s
        if now >= free_at:
            disk.free()
            print(f"[chaos {now - started:5.0f}s] the archive's disk has room again", flush=True)
            free_at = float("inf")
        if now >= damage_at and damage_checkpoint(run_dir):
            pid = pid_of(run_dir, "trainer")
            if pid is not None and kill_group(pid):
                chaos.checkpoints_damaged += 1
                chaos.kills["trainer"] = chaos.kills.get("trainer", 0) + 1
                chaos.events.append((time.time(), "damaged checkpoint"))
                print(f"[chaos {now - started:5.0f}s] truncated the newest checkpoint, SIGKILL trainer (pid {pid})",
                      flush=True)
            damage_at = float("inf")
            next_kill = max(next_kill, now + args.kill_every_s[0])  # not the trainer just killed, again
        if names and now >= next_kill and (args.kills is None or sum(chaos.kills.values()) < args.kills):
            name = rng.choice(names)
            pid = pid_of(run_dir, name)
            if pid is not None and kill_group(pid):
                chaos.kills[name] = chaos.kills.get(name, 0) + 1
                chaos.events.append((time.time(), f"kill {name}"))
                print(f"[chaos {now - started:5.0f}s] SIGKILL {name} (pid {pid})", flush=True)
                next_kill = now + rng.uniform(*args.kill_every_s)
        if down is None and now >= next_broker and (args.broker_bounces is None or chaos.broker_kills < args.broker_bounces):
            node = rng.choice(cluster.running_nodes())
            cluster.stop_node(node, kill=True)
            chaos.broker_kills += 1
            chaos.events.append((time.time(), f"broker down {args.broker_down_s:.0f} s"))
            down = (node, now + args.broker_down_s)
            print(f"[chaos {now - started:5.0f}s] SIGKILL broker {node}", flush=True)
        if down is not None and now >= down[1]:
            cluster.start_node(down[0])
            print(f"[chaos {time.monotonic() - started:5.0f}s] broker {down[0]} back", flush=True)
            down, next_broker = None, time.monotonic() + args.broker_every_s
        bounces_done = args.broker_every_s <= 0 or (args.broker_bounces is not None and chaos.broker_kills >= args.broker_bounces)
        if args.kills is not None and sum(chaos.kills.values()) >= args.kills and down is None and bounces_done:
            break  # the kills and bounces asked for are done; the settle time after them lets the last one restart
        time.sleep(0.5)
    if down is not None:
        cluster.start_node(down[0])
    if free_at != float("inf"):
        disk.free()
    chaos.chaos_s = time.monotonic() - started


class SmallDisk:
    """A tmpfs of `mb` MiB for the archive (mounting needs root: without it the fault is left out, and
    said so); `fill()` takes every free byte with a file, `free()` gives them back."""

    def __init__(self, path: Path, mb: int = 256):
        self.path, self.filler = path, path / ".filler"
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mb}m", "tmpfs", str(path)], capture_output=True,
                              text=True)
        self.mounted = done.returncode == 0
        if not self.mounted:
            print(f"[chaos] no disk fill: cannot mount a tmpfs ({done.stderr.strip()})", flush=True)

    def fill(self) -> int:
        taken, chunk = 0, b"\0" * (1 << 20)
        with open(self.filler, "wb", buffering=0) as f:
            try:
                while True:
                    taken += f.write(chunk)
            except OSError:  # ENOSPC: full
                pass
        return taken

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.path)], capture_output=True)


def damage_checkpoint(run_dir: Path) -> bool:
    """Truncate the largest file of the trainer's newest checkpoint to half (a crash mid-copy, a bad disk)."""
    root = run_dir / "checkpoints" / f"{NAMESPACE}-{STAGE}"
    try:
        newest = root / (root / "LATEST").read_text().strip()
        victim = max((f for f in newest.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    except (OSError, ValueError):
        return False  # no checkpoint yet: try again later
    with open(victim, "r+b") as f:
        f.truncate(victim.stat().st_size // 2)
    return True


def progress_cost(events: list, rows: list[dict]) -> dict[str, list[float]]:
    """Seconds of training progress each fault cost: the wait for the trainer's next step after it, less
    the median wait between steps (what the step would have taken anyway)."""
    times = sorted(r["time"] for r in rows)
    gaps = sorted(b - a for a, b in zip(times, times[1:]))
    usual = gaps[len(gaps) // 2] if gaps else 0.0
    cost: dict[str, list[float]] = {}
    for when, what in events:
        after = next((t for t in times if t > when), None)
        if after is not None:
            cost.setdefault(what, []).append(round(max(0.0, after - when - usual), 1))
    return cost


def kill_group(pid: int) -> bool:
    try:
        os.killpg(pid, signal.SIGKILL)
        return True
    except ProcessLookupError:  # it died on its own just now
        return False


def stop_feeder(run_dir: Path, proc: subprocess.Popen) -> None:
    """SIGTERM the feeder: it exits cleanly, so the run drains what was published and ends."""
    deadline = time.monotonic() + 120
    while (pid := pid_of(run_dir, "feeder")) is None:
        if proc.poll() is not None:
            return
        if time.monotonic() > deadline:
            raise TimeoutError("the feeder did not come back")
        time.sleep(1)
    os.killpg(pid, signal.SIGTERM)


class PoisonFeed(threading.Thread):
    """For each record of raw traffic, with probability `rate`, one poison record from a plain producer."""

    def __init__(self, kafka: KafkaSettings, rate: float, seed: int, chaos: Chaos):
        super().__init__(name="poison", daemon=True)
        self.kafka, self.rate, self.rng, self.chaos = kafka, rate, random.Random(seed + 1), chaos
        self.topic = Topics(f"{NAMESPACE}-{STAGE}").raw
        self.halt = threading.Event()

    def __enter__(self) -> "PoisonFeed":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join(60)

    def _acknowledged(self, _metadata: object) -> None:
        # Counted once on the topic: in a broker's outage this plain producer gives a record up after
        # kafka-python's 120 s delivery timeout, and the pipeline cannot be asked to find it.
        self.chaos.poison_sent += 1

    def run(self) -> None:
        consumer = KafkaConsumer(**self.kafka.kafka_python(), enable_auto_commit=False)
        producer = KafkaProducer(**self.kafka.kafka_python(), acks="all", retries=10)
        parts = [TopicPartition(self.topic, p) for p in sorted(consumer.partitions_for_topic(self.topic) or ())]
        consumer.assign(parts)
        consumer.seek_to_end(*parts)
        try:
            while not self.halt.is_set():
                for messages in consumer.poll(timeout_ms=500).values():
                    for m in messages:
                        if m.key == b"poison":
                            continue
                        self.chaos.raw_seen += 1
                        if self.rng.random() < self.rate:
                            sent = producer.send(self.topic, value=self.rng.choice(POISON), key=b"poison")
                            sent.add_callback(self._acknowledged)
            producer.flush(60)
        finally:
            consumer.close()
            producer.close(10)


def report(kafka: KafkaSettings, run_dir: Path, chaos: Chaos, before_step: int, code: int) -> dict:
    """Print the figures; return them."""
    namespace = f"{NAMESPACE}-{STAGE}"
    books = audit(kafka, namespace, run_dir / "checkpoints" / namespace / "ledger.jsonl")
    state = json.loads((run_dir / "run.json").read_text())
    stage = next((s for s in state["stages"] if s["name"] == STAGE), {})
    rewards = [(r["version"], r["reward_mean"]) for r in trainer_rows(run_dir)]
    before = [v for step, v in rewards if step <= before_step]
    after = [v for _, v in rewards[-20:]]
    result = {
        "run_status": state["status"], "exit_code": code, **asdict(chaos), "chaos_s": round(chaos.chaos_s),
        "published": len(books.published), "trained": len(books.trained),
        "rejected_by_reason": dict(books.rejected_by_reason.most_common()),
        "lost": len(books.lost), "trained_twice": len(books.twice), "tasks_published": len(books.tasks_published),
        "tasks_missing": len(books.tasks_missing), "tasks_published_twice": len(books.tasks_twice),
        "raw_not_experiences": books.raw_not_experiences, "restarts": stage.get("restarts", {}),
        "trainer_steps": int(max((s for s, _ in rewards), default=0)),
        "reward_before": sum(before) / len(before) if before else None,
        "reward_after": sum(after) / len(after) if after else None,
        "run_dir": str(run_dir),
        "progress_cost_s": progress_cost(chaos.events, trainer_rows(run_dir)),
        "load_avg": os.getloadavg(),
    }
    result.pop("events")
    print(f"chaos soak: {result['chaos_s']} s of chaos; killed {chaos.kills}, brokers {chaos.broker_kills}, "
          f"checkpoints damaged {chaos.checkpoints_damaged}, archive disk filled {chaos.disk_fills}; "
          f"poison {chaos.poison_sent} per {chaos.raw_seen} raw records")
    print(f"books: {books.summary()}")
    print(f"seconds of progress each fault cost: {result['progress_cost_s']}; load average {result['load_avg']}")
    print(f"restarts per component: {result['restarts']}; run {state['status']} (exit {code})")
    print(f"reward: {result['reward_before'] or float('nan'):.3f} (steps <= {before_step:.0f}) -> "
          f"{result['reward_after'] or float('nan'):.3f} (last 20 of {result['trainer_steps']} steps)")
    if books.lost:
        print(f"lost, e.g. {sorted(books.lost)[:5]}")
    return result


if __name__ == "__main__":
    sys.exit(main())
