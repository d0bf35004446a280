"""undertow against TRL's GRPOTrainer: the same model, task, reward and hyperparameters, the same wall
time, back to back on the same cores; one evaluator scores both arms' checkpoints afterwards.

    bash infra/bootstrap.sh --vllm --peers
    python benchmarks/peers/trl_vs_undertow.py [--config examples/smollm2_arithmetic_vllm.yaml] [--minutes 40]

1. TRL (benchmarks/peers/trl_grpo.py, in the peers' environment): GRPOTrainer with its own
   generation, the problem's settings mapped from the config, saving every --save-every-minutes.
2. undertow: `undertow run` on the same config, with in-run evaluation off (the peer has none either)
   and a trainer checkpoint every --undertow-checkpoint-every steps kept; stopped as Ctrl-C stops it
   at the bound. Its placement is the config's (`run.cpus`).
3. benchmarks/peers/score_checkpoints.py (in the vLLM environment): every checkpoint of both, and
   the starting weights, on the config's held-out problems with the same engine.
Prints held-out greedy accuracy and pass@k against wall time for both, at every 10-minute mark, the
throughputs, the headline (TRL's accuracy at its bound and how much sooner undertow reached it), and
every hyperparameter of both arms; draws OUT/accuracy.png. --report-only prints from a previous OUT.
A checkpoint's time is when its weights were on disk, counted from its arm's launch (start-up in).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import yaml  # noqa: E402

from benchmarks.smollm2_learning import read_events, run, step_breakdown  # noqa: E402

CACHE = Path(os.environ.get("UNDERTOW_CACHE", Path.home() / ".cache" / "undertow"))
MARKS = (5, 10, 20, 30, 40)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "smollm2_arithmetic_vllm.yaml")
    ap.add_argument("--minutes", type=float, default=40.0, help="each arm's wall-clock bound, start-up included")
    ap.add_argument("--save-every-minutes", type=float, default=5.0, help="TRL's checkpoints")
    ap.add_argument("--undertow-checkpoint-every", type=int, default=8, help="undertow's checkpoints, in steps")
    ap.add_argument("--arms", default="trl,undertow", help="the arms to run (the others are read from OUT)")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "peers" / "trl-vs-undertow")
    ap.add_argument("--report-only", action="store_true")
    args = ap.parse_args()
    arms = {"trl": args.out / "trl", "undertow": args.out / "undertow"}
    if not args.report_only:
        chosen = args.arms.split(",")
        if "trl" in chosen:
            run_trl(args, arms["trl"])
        if "undertow" in chosen:
            run_undertow(args, arms["undertow"])
        score(args.config, [arms[a] for a in chosen])  # an arm read from OUT keeps its scores
    report(args, arms)


def run_trl(args: argparse.Namespace, out: Path) -> None:
    python = CACHE / "peers-venv" / "bin" / "python"
    if not python.exists():
        raise SystemExit(f"no peers' environment at {python.parent.parent}: bash infra/bootstrap.sh --peers")
    subprocess.run([str(python), str(ROOT / "benchmarks" / "peers" / "trl_grpo.py"), "--config", str(args.config),
                    "--minutes", str(args.minutes), "--save-every-minutes", str(args.save_every_minutes),
                    "--out", str(out)], check=True, cwd=ROOT)


def undertow_config(base: dict, checkpoint_every: int) -> dict:
    """The config undertow's arm runs: the same problem, no in-run evaluation, every checkpoint kept."""
    config = {k: v for k, v in base.items() if k != "eval"}
    config["trainer"] = {**base["trainer"], "checkpoint_every": checkpoint_every, "keep_checkpoints": 1000}
    config["run"] = {**base["run"], "steps": 100_000}  # the wall clock bounds it, as TRL's max_steps
    return config


def run_undertow(args: argparse.Namespace, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    config = out / "run.yaml"
    config.write_text(yaml.safe_dump(undertow_config(yaml.safe_load(args.config.read_text()),
                                                     args.undertow_checkpoint_every)))
    launched = time.time()
    run_dir, status = run(argparse.Namespace(config=config, minutes=args.minutes, final_eval_minutes=5.0,
                                             steps=None, runs_dir=out / "runs"))
    saves = sorted(run_dir.glob("checkpoints/*/step-*"))
    (out / "arm.json").write_text(json.dumps({"arm": "undertow", "status": status, "run_dir": str(run_dir), "saves": [
        {"step": int(s.name.split("-")[1]), "seconds": (s / "hf" / "model.safetensors").stat().st_mtime - launched,
         "path": str(s)} for s in saves]}, indent=1))


def score(config: Path, arms: list[Path]) -> None:
    python = CACHE / "vllm-venv" / "bin" / "python"
    subprocess.run([str(python), str(ROOT / "benchmarks" / "peers" / "score_checkpoints.py"), "--config", str(config),
                    *map(str, arms)], check=True, cwd=ROOT)


def at_mark(rows: list[dict], minutes: float, grace_s: float = 15.0) -> dict | None:
    """The last checkpoint on disk by `minutes` (and `grace_s`: TRL saves on the minute, and a save
    lands seconds after it began)."""
    done = [r for r in rows if r["seconds"] <= 60 * minutes + grace_s]
    return done[-1] if done else None


def first_reaching(rows: list[dict], accuracy: float) -> dict | None:
    return next((r for r in rows if r["greedy_accuracy"] >= accuracy), None)


def trl_throughput(out: Path) -> str:
    """Generated and trained tokens per second of wall time, from TRL's logged steps."""
    logs = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    steps = [e for e in logs if "completions/mean_length" in e]
    if not steps:
        return "no logged steps"
    per_step = json.loads((out / "settings.json").read_text())
    completions = per_step["per_device_train_batch_size"] * per_step["gradient_accumulation_steps"]
    generated = sum(e["completions/mean_length"] * completions for e in steps)
    wall = steps[-1]["seconds"]
    return (f"{len(steps)} steps, {wall / len(steps):.1f} s/step; generated {generated / wall:.1f} tok/s, "
            f"trained {steps[-1]['num_tokens'] / wall:.1f} tok/s (prompt + completion)")


def undertow_throughput(out: Path) -> str:
    """The same from undertow's run metrics, with its step broken down."""
    events = read_events(Path(json.loads((out / "arm.json").read_text())["run_dir"]))
    trainer = [e for e in events if e["component"] == "trainer" and "version" in e]
    rollout = [e for e in events if e["component"].startswith("rollout") and "tokens" in e and "generate_s" in e]
    if not trainer:
        return "no trainer steps"
    wall = trainer[-1]["time"] - min(e["time"] for e in events)
    return "\n".join([f"{len(trainer)} steps, {wall / len(trainer):.1f} s/step; generated "
                      f"{sum(e['tokens'] for e in rollout) / wall:.1f} tok/s, trained "
                      f"{sum(e['tokens'] for e in trainer) / wall:.1f} tok/s (prompt + completion)",
                      *step_breakdown(events)])


THROUGHPUT = {"trl": trl_throughput, "undertow": undertow_throughput}


def report(args: argparse.Namespace, arms: dict[str, Path]) -> None:
    scores = {arm: json.loads((out / "scores.json").read_text()) for arm, out in arms.items()
              if (out / "scores.json").exists()}
    print(f"\nheld-out greedy accuracy against wall time ({args.config.name}; load average now "
          f"{os.getloadavg()[0]:.1f})")
    pass_k = next((k for k in next(iter(scores.values()))[0] if k.startswith("pass@") and k != "pass@1"), None) \
        if scores else None
    for arm, rows in scores.items():
        print(f"\n  {arm}:  {'minutes':>8}{'step':>6}{'greedy':>8}{'pass@1':>8}{pass_k or '':>8}")
        for r in rows:
            print(f"  {'':<{len(arm) + 3}}{r['seconds'] / 60:>8.1f}{r['step']:>6}{r['greedy_accuracy']:>8.3f}"
                  f"{r.get('pass@1', float('nan')):>8.3f}{r.get(pass_k, float('nan')):>8.3f}")
        for line in THROUGHPUT[arm](arms[arm]).splitlines():
            print(f"  {'':<{len(arm) + 3}}{line}")
    print(f"\n  {'minutes':<10}" + "".join(f"{m:>8}" for m in MARKS))
    for arm, rows in scores.items():
        cells = [at_mark(rows, m) for m in MARKS]
        print(f"  {arm:<10}" + "".join(f"{c['greedy_accuracy']:>8.3f}" if c else f"{'–':>8}" for c in cells))
    if {"trl", "undertow"} <= scores.keys():
        target = scores["trl"][-1]["greedy_accuracy"]
        trl, ours = first_reaching(scores["trl"], target), first_reaching(scores["undertow"], target)
        if target <= scores["trl"][0]["greedy_accuracy"]:
            print(f"\n  TRL's accuracy at its bound, {target:.3f}, is not above the start's: no headline")
        elif ours is None:
            print(f"\n  TRL's accuracy at its bound: {target:.3f}, reached by TRL at {trl['seconds'] / 60:.1f} min; "
                  f"undertow never reached it (best {max(r['greedy_accuracy'] for r in scores['undertow']):.3f})")
        else:
            print(f"\n  TRL's accuracy at its bound: {target:.3f}, first reached by TRL at {trl['seconds'] / 60:.1f} "
                  f"min and by undertow at {ours['seconds'] / 60:.1f} min: "
                  f"{trl['seconds'] / max(ours['seconds'], 1e-9):.2f}x sooner")
    print("\n  hyperparameters:")
    if (arms["trl"] / "settings.json").exists():
        print(f"    trl (GRPOConfig): {json.loads((arms['trl'] / 'settings.json').read_text())}")
    if (arms["undertow"] / "run.yaml").exists():
        u = yaml.safe_load((arms["undertow"] / "run.yaml").read_text())
        print(f"    undertow: rollout {u['rollout']}, trainer {u['trainer']}, run {u.get('run')}")
    plot(scores, args.out / "accuracy.png")


def plot(scores: dict[str, list[dict]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for arm, rows in scores.items():
        ax.plot([r["seconds"] / 60 for r in rows], [r["greedy_accuracy"] for r in rows], marker="o", label=arm)
    ax.set_xlabel("wall minutes (start-up included)")
    ax.set_ylabel("held-out greedy accuracy")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    print(f"  plot: {path}")


if __name__ == "__main__":
    main()
