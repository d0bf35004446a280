"""On-policy distillation against the reward alone: SmolLM2-135M-Instruct on held-out arithmetic.

    python benchmarks/distill_learning.py [--config examples/smollm2_arithmetic_vllm.yaml] [--minutes 25]
                                          [--teacher HF_DIR]

Two `undertow run`s of the same config, back to back, each bounded to --minutes of wall time:
  reward   the config as it is: GRPO on the numeric-match reward;
  distill  the `on_policy_distill` preset from the same starting weights, its teacher the reward
           arm's last checkpoint (or --teacher): the teacher's per-token log-probs are the only
           signal, the reward is not read.
Both arms are scored by their own run's evaluator on the config's held-out set (facts training never
draws) every --eval-every versions. Prints held-out greedy accuracy and pass@4 against version and
wall minutes for both, and the minutes each took to reach a few accuracies. The teacher is what the
reward arm learned in the same budget: distillation does not make the teacher cheaper, it shows how
fast a dense per-token signal moves the student compared with one reward per answer.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import yaml  # noqa: E402
from smollm2_learning import ROOT, read_events, run  # noqa: E402

TARGETS = (0.4, 0.5, 0.55, 0.6)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, default=ROOT / "examples" / "smollm2_arithmetic_vllm.yaml")
    ap.add_argument("--minutes", type=float, default=25.0, help="wall-clock bound of each arm's RL")
    ap.add_argument("--final-eval-minutes", type=float, default=15.0)
    ap.add_argument("--eval-every", type=int, default=5, help="versions between held-out evaluations")
    ap.add_argument("--coef", type=float, default=1.0, help="the distillation advantage's weight")
    ap.add_argument("--teacher", type=Path, default=None,
                    help="an HF export directory of trained weights (skips the reward arm)")
    ap.add_argument("--runs-dir", type=Path, default=ROOT / "runs" / "bench-distill-learning")
    args = ap.parse_args()
    args.runs_dir.mkdir(parents=True, exist_ok=True)
    base = yaml.safe_load(args.config.read_text())
    base.setdefault("eval", {})["every"] = args.eval_every

    arms: dict[str, tuple[Path, str]] = {}
    teacher = args.teacher
    if teacher is None:
        arms["reward"] = run_arm("reward", base, args)
        teacher = last_checkpoint(arms["reward"][0])
    arms["distill"] = run_arm("distill", distill_config(base, teacher, args.coef), args)

    print(f"\nSmolLM2-135M-Instruct on {args.config.name}, 2 CPU cores, {args.minutes:g} min of RL per arm; "
          f"teacher {teacher}; load average at the end {os.getloadavg()[0]:.1f}")
    curves = {name: curve(run_dir) for name, (run_dir, _) in arms.items()}
    for name, (run_dir, status) in arms.items():
        steps = [e for e in read_events(run_dir) if e["component"] == "trainer" and "version" in e]
        print(f"  {name}: {status}; {len(steps)} trainer steps; {run_dir}")
    print(f"\n  {'arm':<9}{'version':>8}{'minute':>8}{'greedy':>8}{'pass@4':>8}")
    for name, points in curves.items():
        for version, minute, greedy, pass4 in points:
            print(f"  {name:<9}{version:>8}{minute:>8.1f}{greedy:>8.3f}{pass4:>8.3f}")
    print(f"\n  minutes to a held-out greedy accuracy (first evaluation at or above it; '-': not reached)")
    print(f"  {'arm':<9}" + "".join(f"{t:>8.2f}" for t in TARGETS))
    for name, points in curves.items():
        reached = [next((f"{m:.1f}" for _, m, g, _ in points if g >= t), "-") for t in TARGETS]
        print(f"  {name:<9}" + "".join(f"{r:>8}" for r in reached))


def run_arm(name: str, config: dict, args: argparse.Namespace) -> tuple[Path, str]:
    path = args.runs_dir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    arm = argparse.Namespace(config=path, runs_dir=args.runs_dir / name, minutes=args.minutes,
                             final_eval_minutes=args.final_eval_minutes, steps=None)
    return run(arm)


def distill_config(base: dict, teacher: Path, coef: float) -> dict:
    """The same run with the preset's pipeline (clean, distill, prioritize) in place of the reward's."""
    config = yaml.safe_load(yaml.safe_dump(base))
    config["namespace"] = f"{config['namespace']}-distill"
    config["run"]["name"] = f"{config['run']['name']}-distill"
    config["processors"].pop("pipeline", None)
    config["algorithm"] = {"name": "on_policy_distill", "coef": coef,
                           "teacher": {**config["model"], "init_from": str(teacher)},
                           "temperature": config["rollout"]["sampling"]["temperature"]}
    return config


def last_checkpoint(run_dir: Path) -> Path:
    found = sorted(run_dir.glob("checkpoints/*/step-*/hf"), key=lambda p: p.parent.name)
    if not found:
        raise SystemExit(f"the reward arm left no checkpoint under {run_dir}/checkpoints: no teacher to distill from")
    return found[-1]


def curve(run_dir: Path) -> list[tuple[int, float, float, float]]:
    """(version, minutes since the run's first event, greedy accuracy, pass@4) of each evaluation."""
    events = read_events(run_dir)
    if not events:
        return []
    start = min(e["time"] for e in events)
    out = []
    for e in sorted((e for e in events if e["component"] == "eval"), key=lambda e: e["step"]):
        greedy = next((v for k, v in e.items() if k.endswith("/greedy_accuracy")), float("nan"))
        pass4 = next((v for k, v in e.items() if k.endswith("/pass@4")), float("nan"))
        out.append((e["step"], (e["time"] - start) / 60, greedy, pass4))
    return out


if __name__ == "__main__":
    main()
