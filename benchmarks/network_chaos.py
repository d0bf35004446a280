"""Network chaos: the demo's RL stage across the deployment's hosts, through the network's faults.

    python benchmarks/network_chaos.py                                   # every fault, one after another
    python benchmarks/network_chaos.py --faults trainer_ranks_cut --json out.json

The hosts are `infra/deploy/compose.yaml`'s services in network namespaces (tests/faults/deployment.py):
3 brokers, 2 processor hosts, 2 rollout hosts, the trainer's 2 nodes (gloo between them), the evaluator
and the feeder. The RL stage starts from the demo's SFT warm-up (`--init-from`, else it is run first on
loopback). Once the trainer has taken `--before-steps` steps, each fault of `--faults` runs in turn,
`--gap-s` apart; then the feeder is stopped cleanly, the hosts drain what it published, and the books
are checked (tests/audit.py): nothing lost, nothing trained twice, every task published reached the raw
topic. For each fault, from readings every 5 s: the trainer's steps during it and the seconds from its
heal to its next step; the seconds from its heal until the pipeline's lag (tasks, raw and ready
experiences not yet taken, as `undertow status --json` reports each topic's) is back within one trainer
batch of its level before; raw experiences/s before, during and after it; the restarts it caused; and
`undertow status --json` run on a host mid-fault. Exits 1 if anything was lost, trained twice or missing.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.audit import audit  # noqa: E402
from tests.faults.deployment import CLI, Deployment  # noqa: E402
from undertow.infra.report.namespace import namespace_status  # noqa: E402
from undertow.infra.report.scaling import lag_report  # noqa: E402
from undertow.infra.run.config import RunStage, stage_mapping  # noqa: E402
from undertow.infra.run.runner import latest_export  # noqa: E402
from undertow.streams import KafkaSettings, Topics  # noqa: E402

NAMESPACE = "netchaos"
BATCH = 64  # the demo trainer's experiences per step: "back to its level" allows one batch more


# -- the faults: each holds its fault for `seconds` and heals it --------------------------------

@contextmanager
def cut(d: Deployment, host: str, peers: list[str], **kw: bool):
    d.net.cut(host, peers, **kw)
    try:
        yield
    finally:
        d.net.heal(host)


def rollout_host_partitioned(d: Deployment, seconds: float) -> None:
    """A rollout host cut off from every broker, longer than its consumer session."""
    with cut(d, "rollout-1", d.brokers):
        time.sleep(seconds)


def broker_isolated(d: Deployment, seconds: float) -> None:
    """One broker cut off from the other two while every client still reaches it."""
    with cut(d, d.brokers[0], d.brokers[1:]):
        time.sleep(seconds)


def processor_replies_lost(d: Deployment, seconds: float) -> None:
    """Asymmetric: a processor host's packets reach the brokers, their replies never come back."""
    with cut(d, "processors-1", d.brokers, inbound=True, outbound=False):
        time.sleep(seconds)


def trainer_ranks_cut(d: Deployment, seconds: float) -> None:
    """The trainer's two nodes cut from each other (their collectives and rendezvous)."""
    with cut(d, "trainer-1", ["trainer-0"]):
        time.sleep(seconds)


def slow_lossy_link(d: Deployment, seconds: float) -> None:
    """A rollout host's link to the brokers: 100 ms +- 20 added to what it sends, its downloads (the
    weights among them) capped at 100 KB/s, and 2% of its packets lost each way."""
    d.link.toxic("latency", streams=("upstream",), latency=100, jitter=20)
    d.link.toxic("bandwidth", streams=("downstream",), rate=100)
    d.net.lose(d.proxied, 2)
    try:
        time.sleep(seconds)
    finally:
        d.link.clear()
        d.net.heal(d.proxied)


def broker_link_flapping(d: Deployment, seconds: float) -> None:
    """A broker host's link down 5 s, up 10 s, over and over."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        d.net.link(d.brokers[1], up=False)
        time.sleep(5)
        d.net.link(d.brokers[1], up=True)
        time.sleep(10)


FAULTS = {f.__name__: (f, seconds) for f, seconds in (
    (rollout_host_partitioned, 90), (broker_isolated, 60), (processor_replies_lost, 45), (trainer_ranks_cut, 30),
    (slow_lossy_link, 90), (broker_link_flapping, 120))}


# -- the run ------------------------------------------------------------------------------------

@dataclass
class Sample:
    t: float
    lag: int  # the pipeline's: tasks not yet generated, raw experiences not yet processed, ready ones not trained
    raw: int
    steps: int  # the trainer's, from its ledger


class Watch(threading.Thread):
    """The namespace's lag and raw-record count every `every` s, seen from the creating process."""

    def __init__(self, kafka: KafkaSettings, workdir: Path, every: float = 5.0):
        super().__init__(name="lag", daemon=True)
        self.kafka, self.workdir, self.every = kafka, workdir, every
        self.samples: list[Sample] = []
        self.halt = threading.Event()

    def run(self) -> None:
        topics = Topics(NAMESPACE)
        while not self.halt.wait(self.every):
            try:
                report = lag_report(namespace_status(self.kafka, NAMESPACE))
            except Exception as e:  # noqa: BLE001 — a fault may stall the admin client: the gap is the figure
                print(f"[watch] no lag reading: {type(e).__name__}: {e}", flush=True)
                continue
            lag = sum(report["topic_lag"].get(t, 0) for t in (topics.tasks, topics.raw, topics.ready))
            self.samples.append(Sample(time.monotonic(), lag, report["records"].get(topics.raw, 0),
                                       trainer_steps(self.workdir)))

    def between(self, start: float, end: float) -> list[Sample]:
        return [s for s in self.samples if start <= s.t <= end]


def rl_config(init_from: Path, workdir: Path) -> Path:
    """The demo's RL stage as one component config, on a replicated topic catalog, tasks until stopped."""
    raw = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    rl = RunStage.model_validate(next(s for s in raw["run"]["stages"] if s["name"] == "rl"))
    cfg = stage_mapping(raw, rl)
    cfg.pop("run")
    cfg["namespace"] = NAMESPACE
    cfg["model"]["init_from"] = str(init_from)
    cfg["feeder"]["epochs"] = None  # the benchmark stops the feeder once the faults are over
    cfg["topics"] = {"replication": 3, "partitions": {"tasks": 4, "experiences.raw": 2}}  # 2 of each worker
    cfg["trainer"].update(checkpoint_dir=str(workdir / "checkpoints"), checkpoint_every=10)
    # Shorter than the 30-s cut of the trainer's nodes: their collective gives up, both nodes exit and the
    # deployment restarts them from the checkpoint (the default, DeepSpeed's 10 minutes, would outlast it).
    cfg["trainer"].setdefault("engine", {})["collective_timeout_s"] = 20
    # Partial groups (a sample lost to a fault) are released within 10 + 10 s, as in tests/faults/.
    cfg["processors"]["group_timeout_s"] = 10
    cfg["trainer"]["batching"]["group_timeout_s"] = 10
    path = workdir / "rl.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def warm_start(workdir: Path) -> Path:
    """The demo's SFT warm-up, run on loopback (its own broker): its last export."""
    raw = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    raw["run"]["stages"] = [s for s in raw["run"]["stages"] if s["name"] == "warmup"]
    raw["run"]["archive"] = False
    path = workdir / "warmup.yaml"
    path.write_text(yaml.safe_dump(raw))
    subprocess.run([*CLI, "run", str(path), "--runs-dir", str(workdir / "warmup"), "--no-live"], cwd=ROOT, check=True,
                   env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.DEVNULL)
    (run_dir,) = (workdir / "warmup").iterdir()
    return latest_export(run_dir / "checkpoints" / "demo-warmup")


def trainer_steps(workdir: Path) -> int:
    ledger = workdir / "checkpoints" / NAMESPACE / "ledger.jsonl"
    return len(ledger.read_text().splitlines()) if ledger.exists() else 0


def wait(what: str, done, d: Deployment, timeout: float) -> None:
    """Poll the deployment (restarting what failed) until `done()`; a timeout says what the hosts held."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s\n{d.logs()}")
        d.poll()
        time.sleep(1)


def status_json(d: Deployment) -> dict:
    """`undertow status --json` as an operator on the feeder's host runs it."""
    out = d.net.run("feeder", [*CLI, "status", "-c", str(d.config), "--json"], env={**os.environ,
                    "UNDERTOW_BOOTSTRAP": d.bootstrap}, capture_output=True, text=True, timeout=120)
    return json.loads(out.stdout) if out.returncode == 0 else {"error": (out.stdout + out.stderr)[-500:]}


def run_fault(name: str, d: Deployment, watch: Watch, gap_s: float) -> dict:
    fault, seconds = FAULTS[name]
    restarts = {s.host: s.restarts for s in d.services}
    start = time.monotonic()
    mid: dict = {}
    probe = threading.Timer(seconds / 2, lambda: mid.update(status_json(d)))
    probe.start()
    print(f"[{name}] {seconds} s", flush=True)
    runner = threading.Thread(target=fault, args=(d, seconds))
    runner.start()
    while runner.is_alive():  # the deployment's restart policy goes on meanwhile
        d.poll()
        runner.join(1)
    healed = time.monotonic()
    probe.join()
    wait(f"{gap_s:.0f} s after {name}", lambda: time.monotonic() > healed + gap_s, d, gap_s + 60)
    before = watch.between(start - 30, start)
    level = max((s.lag for s in before), default=0) + BATCH
    back = next((s.t - healed for s in watch.samples if s.t >= healed and s.lag <= level), None)
    at_heal = next((s.steps for s in reversed(watch.samples) if s.t <= healed), 0)
    stepped = next((s.t - healed for s in watch.samples if s.t >= healed and s.steps > at_heal), None)
    rate = lambda w: (w[-1].raw - w[0].raw) / (w[-1].t - w[0].t) if len(w) > 1 and w[-1].t > w[0].t else None  # noqa: E731
    figures = {"fault": name, "seconds": seconds, "lag_before": level - BATCH,
               "lag_peak": max((s.lag for s in watch.between(start, healed + gap_s)), default=None),
               "back_to_level_s": None if back is None else round(back, 1),
               "first_step_after_heal_s": None if stepped is None else round(stepped, 1),
               "trainer_steps_during": at_heal - next((s.steps for s in reversed(watch.samples) if s.t <= start), 0),
               "raw_per_s_before": rate(before), "raw_per_s_during": rate(watch.between(start, healed)),
               "raw_per_s_after": rate(watch.between(healed, healed + gap_s)),
               "restarts": {s.host: s.restarts - restarts[s.host] for s in d.services if s.restarts > restarts[s.host]},
               "status_mid_fault": {"groups": {g: v["lag"] for g, v in mid.get("groups", {}).items()},
                                    "error": mid.get("error")}}
    print(f"[{name}] {figures}", flush=True)
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stopped benchmark takes its hosts down too
    work = Path(args.workdir or tempfile.mkdtemp(prefix="network-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    init_from = Path(args.init_from) if args.init_from else warm_start(work)
    config = rl_config(init_from, work)
    started = time.monotonic()
    with Deployment(config, work, proxied="rollout-1" if "slow_lossy_link" in args.faults else None) as d:
        kafka = KafkaSettings(bootstrap_servers=d.bootstrap)
        watch = Watch(kafka, work)
        watch.start()
        wait(f"{args.before_steps} trainer steps", lambda: trainer_steps(work) >= args.before_steps, d, 900)
        faults = [run_fault(name, d, watch, args.gap_s) for name in args.faults]
        d.stop([d.service("feeder")])  # SIGTERM: it exits cleanly; the others drain what it published
        stopped = time.monotonic()
        drained = lambda: [s.lag for s in watch.samples if s.t > stopped][-3:] == [0, 0, 0]  # noqa: E731
        wait("the published tasks drained (3 readings of no lag)", drained, d, args.drain_timeout_s)
        steps = trainer_steps(work)
        d.stop()
        watch.halt.set()
        books = audit(kafka, NAMESPACE, work / "checkpoints" / NAMESPACE / "ledger.jsonl")
        result = {"faults": faults, "published": len(books.published), "trained": len(books.trained),
                  "rejected_by_reason": dict(books.rejected_by_reason.most_common()), "lost": len(books.lost),
                  "trained_twice": len(books.twice), "tasks_published": len(books.tasks_published),
                  "tasks_missing": len(books.tasks_missing), "tasks_published_twice": len(books.tasks_twice),
                  "trainer_steps": steps, "restarts": {s.host: s.restarts for s in d.services},
                  "minutes": round((time.monotonic() - started) / 60, 1), "load_avg": os.getloadavg(),
                  "hosts": d.net.hosts}
    print(f"books: {books.summary()}; restarts {result['restarts']}; {steps} steps in {result['minutes']} min; "
          f"load average {result['load_avg']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if not (books.lost or books.twice or books.tasks_missing or books.tasks_twice) else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--faults", type=lambda s: [f for f in s.split(",") if f], default=list(FAULTS),
                   help=f"comma-separated, in order (default: all): {', '.join(FAULTS)}")
    p.add_argument("--before-steps", type=int, default=10, help="trainer steps before the first fault")
    p.add_argument("--gap-s", type=float, default=60.0, help="seconds after each heal before the next fault")
    p.add_argument("--drain-timeout-s", type=float, default=600.0)
    p.add_argument("--init-from", help="the demo's SFT warm-up export (default: run the warm-up first)")
    p.add_argument("--workdir", help="where the hosts' logs, checkpoints and the brokers' data go")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    unknown = [f for f in args.faults if f not in FAULTS]
    if unknown:
        p.error(f"--faults: unknown {unknown}; known: {list(FAULTS)}")
    return args


if __name__ == "__main__":
    sys.exit(main())
