"""Asynchronous vs synchronous RL on the demo: time to reach a reward threshold, trainer idle fraction.

    python benchmarks/loop_async_vs_sync.py [--steps 300] [--threshold 0.4]

Both runs use examples/demo.yaml with the same seed and step budget; only max_staleness differs
(2 = asynchronous, 0 = synchronous on-policy). Prints each run's figures and async/sync ratios
measured in this one invocation (the machines are noisy: compare ratios, not seconds).
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


def run_mode(base: dict, staleness: int, steps: int, workdir: Path) -> Path:
    cfg = copy.deepcopy(base)
    cfg["rollout"]["max_staleness"] = staleness
    cfg["trainer"]["batching"]["max_staleness"] = staleness
    cfg["run"]["stages"][-1]["steps"] = steps
    cfg["run"]["name"] = f"staleness{staleness}"
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


def figures(run_dir: Path, threshold: float, window: int = 20) -> dict[str, float]:
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("stage") == "rl" and r["component"] == "trainer"]
    t0 = rows[0]["time"] - rows[0].get("step_s", 0.0) - rows[0].get("wait_s", 0.0)
    rewards = [r.get("reward_mean", 0.0) for r in rows]
    reached = next((rows[i]["time"] - t0 for i in range(window, len(rows) + 1)
                    if sum(rewards[i - window:i]) / window >= threshold), float("inf"))
    wall = rows[-1]["time"] - t0
    waiting = sum(r.get("wait_s", 0.0) for r in rows)
    return {"seconds_to_threshold": reached, "rl_wall_s": wall, "idle_fraction": waiting / wall,
            "final_reward": sum(rewards[-window:]) / window}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="RL steps per run")
    parser.add_argument("--threshold", type=float, default=0.4, help="reward (mean of 20 steps) to reach")
    args = parser.parse_args()
    base = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    result = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, staleness in (("async", 2), ("sync", 0)):  # each printed when done: a run takes minutes
            f = result[name] = figures(run_mode(base, staleness, args.steps, Path(tmp)), args.threshold)
            print(f"{name:5s}: reward {f['final_reward']:.3f} at the end, threshold {args.threshold} reached after "
                  f"{f['seconds_to_threshold']:.0f}s, RL wall {f['rl_wall_s']:.0f}s, "
                  f"trainer idle {f['idle_fraction']:.1%}", flush=True)
    a, s = result["async"], result["sync"]
    print(f"time to threshold, sync / async: {s['seconds_to_threshold'] / a['seconds_to_threshold']:.2f}x "
          f"(target >= 1.5x); trainer idle async {a['idle_fraction']:.1%} (target < 10%), "
          f"sync / async idle: {s['idle_fraction'] / max(a['idle_fraction'], 1e-9):.2f}x")


if __name__ == "__main__":
    main()
