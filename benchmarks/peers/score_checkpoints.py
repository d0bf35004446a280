"""One evaluator for every arm of a peer comparison: each saved checkpoint scored after the runs, on
the config's held-out tasksets, by the same engine and the same code.

    ~/.cache/undertow/vllm-venv/bin/python benchmarks/peers/score_checkpoints.py \\
        --config examples/smollm2_arithmetic_vllm.yaml ARM_DIR [ARM_DIR ...]

Each ARM_DIR holds an arm.json listing its saves ({step, seconds, path}: an HF directory). The
config's rollout engine is built once on the starting weights, which are scored as step 0 at second
0 of every arm; each checkpoint's safetensors are then loaded into that same engine
(`Engine.load_weight_files`, the files transport's path) and scored by undertow's Evaluator (greedy
accuracy, pass@k, as `undertow eval`). Writes ARM_DIR/scores.json. Scoring costs neither run
anything: it happens after both.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def weight_files(directory: Path) -> list[Path]:
    """An HF directory's safetensors (or those of a trainer checkpoint's hf/)."""
    from undertow.rollout.eval_runner import export_dir

    files = sorted(export_dir(directory).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{directory}: no *.safetensors there or in its hf/")
    return files


def scored(result_list: list, step: int, seconds: float) -> dict:
    """One row of scores.json: the first held-out taskset's figures at (step, seconds)."""
    r = result_list[0]
    return {"step": step, "seconds": seconds, "taskset": r.taskset, "tasks": r.tasks,
            "greedy_accuracy": r.greedy_accuracy, **r.pass_at, "mean_reward": r.mean_reward,
            "mean_response_tokens": r.mean_response_tokens, "eval_seconds": r.seconds}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("arms", type=Path, nargs="+", help="directories holding an arm.json")
    args = ap.parse_args()

    from undertow.infra.run.config import load_component_config
    from undertow.rollout.engines import build_engine
    from undertow.rollout.evaluation import Evaluator

    cfg = load_component_config(args.config)
    if not cfg.eval.tasksets:
        raise SystemExit(f"{args.config}: eval.tasksets names no held-out taskset to score")
    engine = build_engine(cfg.rollout.engine, cfg.model)
    evaluator = Evaluator(engine, cfg.rollout, cfg.eval, cfg.model.name)
    started = time.time()
    base = scored(evaluator.evaluate(version=0), step=0, seconds=0.0)
    print(f"start: greedy {base['greedy_accuracy']:.3f}", flush=True)
    for arm in args.arms:
        saves = json.loads((arm / "arm.json").read_text())["saves"]
        rows = [base]
        for save in saves:
            engine.load_weight_files(weight_files(Path(save["path"])))
            rows.append(scored(evaluator.evaluate(version=save["step"]), save["step"], save["seconds"]))
            print(f"{arm.name} step {save['step']} ({save['seconds'] / 60:.1f} min): "
                  f"greedy {rows[-1]['greedy_accuracy']:.3f}", flush=True)
        (arm / "scores.json").write_text(json.dumps(rows, indent=1))
    print(f"scored in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
