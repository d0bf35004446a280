"""SmolLM2-135M-Instruct learns arithmetic by RL on this CPU: held-out accuracy before and after.

    python benchmarks/smollm2_learning.py [--config examples/smollm2_arithmetic.yaml] [--minutes 40] [--steps N]

Runs `undertow run CONFIG` (with its own broker). The evaluator the run starts scores the held-out
taskset on the weights the run starts from (version 0) and on the last ones. RL is bounded in time:
after --minutes the run is stopped as Ctrl-C stops it (the trainer checkpoints, the evaluator
scores the last weights it holds, for up to eval.stop_timeout_s). Prints the settings, held-out
greedy accuracy, pass@1 and pass@4 before and after side by side, the steps done, the training
batches' reward and the wall times, read from the run directory's metrics.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

SCORES = ("greedy_accuracy", "pass@1", "pass@4", "mean_reward", "mean_response_tokens")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "smollm2_arithmetic.yaml")
    ap.add_argument("--minutes", type=float, default=40.0, help="wall-clock bound of RL (start-up included)")
    # 200 problems x (1 greedy + 4 sampled) answers took 8-25 min on 2 cores shared with other jobs.
    ap.add_argument("--final-eval-minutes", type=float, default=25.0,
                    help="after RL, how long the evaluation of the last weights may take before all is killed")
    ap.add_argument("--steps", type=int, default=None, help="trainer steps (default: the config's run.steps)")
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "bench-smollm2-learning")
    args = ap.parse_args()
    started = time.time()
    run_dir, status = run(args)
    report(run_dir, yaml.safe_load(args.config.read_text()), status, time.time() - started, args)


def run(args: argparse.Namespace) -> tuple[Path, str]:
    """`undertow run` in a process group of its own; SIGINT at the RL bound, SIGKILL if the last
    evaluation outlives --final-eval-minutes after it."""
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    before = set(args.runs_dir.iterdir())
    command = [sys.executable, "-m", "undertow.infra.cli", "run", str(args.config), "--runs-dir", str(args.runs_dir),
               "--no-live", *(["--steps", str(args.steps)] if args.steps else [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen(command, cwd=ROOT, env=env, start_new_session=True)
    start = time.time()
    stop_at, kill_at = start + 60 * args.minutes, start + 60 * (args.minutes + args.final_eval_minutes)
    status = "done"
    while proc.poll() is None:
        now = time.time()
        if now >= kill_at:
            kill_all(proc, args.runs_dir, before)
            status = "killed: the last evaluation outlived --final-eval-minutes"
        elif now >= stop_at and status == "done":
            os.killpg(proc.pid, signal.SIGINT)  # the run stops in order: trainer checkpoints, evaluator scores
            status = f"RL stopped at the {args.minutes:g}-minute bound"
        time.sleep(2)
    if proc.returncode not in (0, 130) and status == "done":
        status = f"failed (exit {proc.returncode})"
    made = sorted(set(args.runs_dir.iterdir()) - before)
    if not made:
        raise SystemExit(f"undertow run made no run directory under {args.runs_dir} (exit {proc.returncode})")
    return made[-1], status


def kill_all(proc: subprocess.Popen, runs_dir: Path, before: set[Path]) -> None:
    """The run and its components, each in a process group of its own (their pid files)."""
    for pid_file in (p for d in set(runs_dir.iterdir()) - before for p in d.glob("logs/*/*.pid")):
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except (OSError, ValueError):
            pass  # already gone
    os.killpg(proc.pid, signal.SIGKILL)


def read_events(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def step_breakdown(events: list[dict]) -> list[str]:
    """Where a step's wall time went, from the run's metrics: the trainer's compute, its wait for
    data, its publish and checkpoint (and the rest: intake and bookkeeping); the rollout's generation,
    its share of the wall and its swaps; each processor stage's latency; the evaluations."""
    trainer = sorted((e for e in events if e["component"] == "trainer" and "version" in e), key=lambda e: e["time"])
    if len(trainer) < 2:
        return ["step breakdown: fewer than 2 trainer steps"]
    steps = trainer[1:]  # each interval ends at a step's metric
    mean = lambda key: sum(e.get(key, 0.0) for e in steps) / len(steps)  # noqa: E731
    interval = (trainer[-1]["time"] - trainer[0]["time"]) / len(steps)
    parts = {k: mean(k) for k in ("step_s", "wait_s", "publish_s", "checkpoint_s")}
    lines = [f"trainer, per step ({len(steps)} intervals): {interval:.1f} s = compute {parts['step_s']:.1f} + wait for "
             f"data {parts['wait_s']:.1f} + publish {parts['publish_s']:.1f} + checkpoint {parts['checkpoint_s']:.1f}"
             f" + other {interval - sum(parts.values()):.1f}"]
    span = trainer[-1]["time"] - trainer[0]["time"]
    for worker in sorted({e["component"] for e in events if e["component"].startswith("rollout")}):
        mine = [e for e in events if e["component"] == worker and trainer[0]["time"] < e["time"] <= trainer[-1]["time"]]
        swaps = [e["weight_swap_s"] for e in mine if "weight_swap_s" in e]
        mine = [e for e in mine if "generate_s" in e]
        if mine:
            lines.append(f"{worker}: generating {sum(e['generate_s'] for e in mine) / span:.0%} of the wall, "
                         f"{sum(e.get('tokens', 0.0) for e in mine) / span:.1f} tokens/s; {len(swaps)} swaps of "
                         f"{sum(swaps) / max(len(swaps), 1):.2f} s")
    stages = [e for e in events if e["component"] == "processors"]
    latency = sorted({k for e in stages for k in e if k.endswith(".latency_ms")})
    if latency:
        lines.append("processors, mean latency: " + ", ".join(
            f"{k.split('.')[0]} {sum(e[k] for e in stages if k in e) / sum(k in e for e in stages):.0f} ms" for k in latency))
    evals = [e for e in events if e["component"] == "eval"]
    lines.append(f"evaluations in the run: {len(evals)}")
    return lines


def report(run_dir: Path, config: dict, status: str, wall_s: float, args: argparse.Namespace) -> None:
    events = read_events(run_dir)
    evals = sorted((e for e in events if e["component"] == "eval"), key=lambda e: e["step"])
    trainer = sorted((e for e in events if e["component"] == "trainer" and "version" in e), key=lambda e: e["version"])
    print(f"\nSmolLM2-135M-Instruct, RL on arithmetic, 2 CPU cores: {run_dir}")
    rl_s = (trainer[-1]["time"] - min(e["time"] for e in events)) if trainer else 0.0
    print(f"  run: {status}; {len(trainer)} trainer steps, last one {rl_s / 60:.1f} min after the run's first "
          f"event; {wall_s / 60:.1f} min wall with the last evaluation (RL bound {args.minutes:g} min); "
          f"load average at the end {os.getloadavg()[0]:.1f}")
    for line in settings(config, args):
        print(f"  {line}")
    if trainer:
        first, last = trainer[0], trainer[-1]
        print(f"  training batches' mean reward: {first.get('reward_mean', float('nan')):.3f} (step "
              f"{first['version']:.0f}) -> {last.get('reward_mean', float('nan')):.3f} (step {last['version']:.0f}); "
              f"mean step {sum(e.get('step_s', 0) for e in trainer) / len(trainer):.0f} s (waits for data included)")
    for line in step_breakdown(events):
        print(f"  {line}")
    if len(evals) < 2:
        print(f"  held-out: {len(evals)} evaluation(s) recorded, need the first and the last "
              f"(see {run_dir}/logs/*/eval.log)")
        return
    before, after = evals[0], evals[-1]
    for taskset in sorted({k.split("/")[0] for k in before if k.endswith("/greedy_accuracy")}):
        print(f"\n  held-out {taskset}: version {before['step']} (before) vs {after['step']} (after)")
        print(f"  {'':<22}{'before':>10}{'after':>10}")
        for score in SCORES:
            key = f"{taskset}/{score}"
            if key in before and key in after:
                print(f"  {score:<22}{before[key]:>10.3f}{after[key]:>10.3f}")
    if len(evals) > 2:
        curve = ", ".join(f"v{e['step']} {e.get(f'{taskset}/greedy_accuracy', float('nan')):.3f}" for e in evals)
        print(f"  greedy accuracy by version: {curve}")


def settings(config: dict, args: argparse.Namespace) -> list[str]:
    """The figures that decide what the run is: model, task, batch, sampling, optimizer."""
    feeder, rollout, trainer, ev = (config.get(k) or {} for k in ("feeder", "rollout", "trainer", "eval"))
    sampling, engine, batching = rollout.get("sampling", {}), trainer.get("engine", {}), trainer.get("batching", {})
    held = ev.get("tasksets", [{}])[0].get("source", {})
    steps = args.steps or (config.get("run") or {}).get("steps")
    return [f"config {args.config.relative_to(ROOT) if args.config.is_relative_to(ROOT) else args.config}, "
            f"steps asked {steps}",
            f"train: {feeder['tasksets'][0]['source']}",
            f"held-out: {held} (greedy + {ev.get('samples', 0)} samples at T {ev.get('temperature', 1.0)})",
            f"batch {batching.get('experiences')} experiences = {batching.get('experiences', 0) // feeder.get('group_size', 1)}"
            f" prompts x {feeder.get('group_size')} samples, T {sampling.get('temperature')}, "
            f"max_new_tokens {sampling.get('max_new_tokens')}, reward {rollout.get('reward')}",
            f"trainer: lr {engine.get('lr')}, lora {trainer.get('lora')}, "
            f"{trainer.get('algorithm', {}).get('policy_loss')} / {trainer.get('algorithm', {}).get('aggregation')}, "
            f"staleness <= {batching.get('max_staleness')}"]


if __name__ == "__main__":
    main()
