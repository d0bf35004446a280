"""Asynchronous vs synchronous RL on the demo: time to the same evaluated accuracy, each side's idle.

    python benchmarks/loop_async_vs_sync.py [--steps 300] [--accuracy 0.6] [--every 10]

Both runs use examples/demo.yaml with the same seed and step budget; only max_staleness differs
(2 = asynchronous, 0 = synchronous on-policy). The trainer is pinned to one CPU and everything else
(rollout, processors, feeder, evaluator) to the other (`run.cpus`), so that the figure is not an
accident of scheduling. The evaluator scores greedy accuracy every --every versions; a run reaches
--accuracy at the time the trainer made the first version scored at or above it. Idle fractions:
the trainer's (waiting for a batch) and the rollout worker's (not generating), over the RL stage.
Prints each run's figures and async/sync ratios measured in this one invocation (the machine is
noisy: compare ratios, not seconds). The demo's evaluation set is the task's 100 sums, which
training also draws: it measures learning the task, not generalisation.
"""

from __future__ import annotations

import argparse
import copy
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from undertow.infra.report.metrics_log import read_metrics  # noqa: E402

MODES = (("async", 2), ("sync", 0))


def pinning() -> dict[str, str]:
    """The trainer on the last usable CPU, the rest of the loop on the others."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        sys.exit("needs 2 CPUs: the trainer and the rollout side each pinned to its own")
    rest = ",".join(map(str, cpus[:-1]))
    return {"trainer": str(cpus[-1]), **{role: rest for role in ("rollout", "processors", "feeder", "eval", "archive")}}


def run_mode(base: dict, staleness: int, args: argparse.Namespace, workdir: Path) -> Path:
    cfg = copy.deepcopy(base)
    cfg["rollout"]["max_staleness"] = staleness
    cfg["trainer"]["batching"]["max_staleness"] = staleness
    cfg["eval"]["every"] = args.every
    cfg["run"]["stages"][-1]["steps"] = args.steps
    cfg["run"].update(name=f"staleness{staleness}", cpus=pinning())
    path = workdir / f"staleness{staleness}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runs, log = workdir / "runs", workdir / f"staleness{staleness}.log"
    command = [sys.executable, "-m", "undertow.infra.cli", "run", str(path), "--runs-dir", str(runs), "--no-live"]
    with open(log, "wb") as out:
        done = subprocess.run(command, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=out,
                              stderr=subprocess.STDOUT)
    if done.returncode:  # the workdir is temporary: show why before it goes
        sys.exit(f"staleness {staleness}: `undertow run` exited {done.returncode}; its output ends:\n"
                 f"{log.read_text(errors='replace')[-3000:]}")
    return next(runs.glob(f"staleness{staleness}-*"))


def figures(run_dir: Path, accuracy: float) -> dict[str, float]:
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("stage") == "rl"]
    trainer = [r for r in rows if r["component"] == "trainer"]
    t0 = trainer[0]["time"] - trainer[0].get("step_s", 0.0) - trainer[0].get("wait_s", 0.0)
    wall = trainer[-1]["time"] - t0
    made_at = {int(r["version"]): r["time"] - t0 for r in trainer}
    scores = sorted((int(r["version"]), v) for r in rows if r["component"] == "eval"
                    for k, v in r.items() if k.endswith("/greedy_accuracy"))
    reached = next((made_at[v] for v, score in scores if score >= accuracy and v in made_at), float("inf"))
    rollout = [r for r in rows if r["component"].startswith("rollout") and t0 <= r["time"] <= t0 + wall]
    generating = sum(r.get("generate_s", 0.0) for r in rollout)
    return {"seconds_to_accuracy": reached, "rl_wall_s": wall, "best_accuracy": max((s for _, s in scores), default=0.0),
            "trainer_idle": sum(r.get("wait_s", 0.0) for r in trainer) / wall,
            "rollout_idle": 1 - generating / wall if generating else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="RL steps per run")
    parser.add_argument("--accuracy", type=float, default=0.6, help="evaluated greedy accuracy to reach")
    parser.add_argument("--every", type=int, default=10, help="evaluate every this many versions")
    args = parser.parse_args()
    base = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, staleness in MODES:  # each printed when done: a run takes minutes
            f = result[name] = figures(run_mode(base, staleness, args, Path(tmp)), args.accuracy)
            print(f"{name:5s}: accuracy {args.accuracy} after {f['seconds_to_accuracy']:.0f}s (best "
                  f"{f['best_accuracy']:.2f}), RL wall {f['rl_wall_s']:.0f}s, trainer idle {f['trainer_idle']:.1%}, "
                  f"rollout idle {f['rollout_idle']:.1%}; load {os.getloadavg()[0]:.1f}", flush=True)
    a, s = result["async"], result["sync"]
    print(f"time to accuracy {args.accuracy}, sync / async: {s['seconds_to_accuracy'] / a['seconds_to_accuracy']:.2f}x "
          f"(target >= 2.8x); trainer idle async {a['trainer_idle']:.1%} (target < 25%)")


if __name__ == "__main__":
    main()
