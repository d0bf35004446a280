"""`undertow run` with `rollout.engine: vllm`: the demo's recipe on a tiny Llama (vLLM needs an HF
directory), rollouts and evaluator in the vLLM environment, the trainer in this one. An SFT warm-up,
after which vLLM's greedy answers on the hot-swapped weights must be right more often on the 100
one-digit sums (the demo's evaluation: the training problems too), then an on-policy RL stage where every importance ratio the trainer computes is 1: its
recomputed log-probs equal vLLM's, after every hot-swap (weights a swap lost or mangled would move
them). Asynchronous RL on vLLM is tests/vllm/test_vllm_async.py's continuous worker and, for
learning, benchmarks/smollm2_learning.py (the real SmolLM2 on vLLM); the demo's 900 asynchronous steps
ran here too until 2026-12-06, 4 of the test's 5.6 minutes for a reward check the demo already makes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from undertow.infra.report.metrics_log import read_metrics
from undertow.infra.run.rollout_env import vllm_python
from tests.run_output import only_run_dir, undertow_run, wait_run
from tests.vllm.tiny_llama import save_tiny_llama

pytestmark = [pytest.mark.broker, pytest.mark.slow]
WARMUP_STEPS, ON_POLICY_STEPS = 60, 20  # 20 hot-swaps, the ratios checked after each


def demo_like(model: Path) -> dict:
    """examples/demo.yaml on a tiny Llama: its SFT warm-up, then on-policy RL instead of asynchronous."""
    return {
        "namespace": "vllm-run", "model": {"source": "hf", "path": str(model)},
        "feeder": {"tasksets": [{"name": "sums", "source": {"name": "sums", "size": 100000, "max_operand": 9}}],
                   "epochs": None, "group_size": 8, "max_lag": 16},
        "rollout": {"engine": {"name": "vllm", "max_model_len": 64}, "chat_template": False,
                    "sampling": {"temperature": 1.0, "max_new_tokens": 4}, "reward": "numeric_match",
                    "max_staleness": 2, "experiences_per_version": 64},
        "processors": {"pipeline": ["clean", {"name": "reshape", "advantage": "grpo"}]},
        "eval": {"tasksets": [{"name": "sums-all", "source": {"name": "sums", "size": 100, "max_operand": 9,
                                                              "seed": 1}}], "every": 150, "max_overlap": 1.0},
        "trainer": {"engine": {"lr": 1.0e-3}, "batching": {"experiences": 64, "max_staleness": 2, "max_wait_s": 2.0},
                    "algorithm": {"objective": "rl", "policy_loss": "ppo_clip", "aggregation": "token_mean"},
                    "sync_every": 1, "checkpoint_every": 1000},
        "run": {"name": "vllm", "stages": [
            {"name": "warmup", "steps": WARMUP_STEPS, "feeder": {"group_size": 1}, "rollout": {"workflow": "reference"},
             "processors": {"pipeline": ["clean"]},
             "trainer": {"engine": {"lr": 3.0e-3}, "batching": {"experiences": 32}, "algorithm": {"objective": "sft"}}},
            {"name": "on-policy", "steps": ON_POLICY_STEPS, "rollout": {"max_staleness": 0},
             "trainer": {"batching": {"max_staleness": 0}}}]},
    }


def rows(run_dir: Path, stage: str, component: str) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("stage") == stage and r["component"] == component]


@pytest.mark.timeout(900)
def test_a_demo_like_run_with_the_vllm_engine_learns_and_on_policy_its_ratios_are_one(tmp_path):
    vllm_python()  # without the vLLM environment this fails, naming `bash infra/bootstrap.sh --vllm`
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(demo_like(save_tiny_llama(tmp_path / "tiny-llama", init_std=None))))
    runs = tmp_path / "runs"
    wait_run(undertow_run(str(path), "--runs-dir", str(runs)), runs, timeout=600)  # 1.5-2 min alone
    run_dir = only_run_dir(runs)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "done"
    rollout_log = next(run_dir.glob("logs/*-on-policy/rollout.log")).read_text()
    assert "vllm" in rollout_log.lower()  # the engine really was vLLM's

    # Each stage's evaluator scored its last weights: SIGTERMed at the stage's end, it still answers
    # (with vLLM's engine in child processes the signal killed them and the evaluator hung).
    for stage, steps in (("warmup", WARMUP_STEPS), ("on-policy", ON_POLICY_STEPS)):
        versions = [int(r["version"]) for r in rows(run_dir, stage, "eval")]
        assert versions[0] == 0 and versions[-1] == steps, (stage, versions)

    # Learning, judged by vLLM's greedy answers on the swapped-in weights. The random tiny Llama gets
    # about 1 of the 100 sums right (binomial SD 0.01 there): an evaluator the warm-up's
    # weights never reached stays there. Seven warm-ups here ended at 0.13-0.47.
    curve = [(int(r["version"]), r["sums-all/greedy_accuracy"]) for r in rows(run_dir, "warmup", "eval")]
    print(f"warm-up greedy accuracy on the 100 sums {curve}")
    (_, before), (_, after) = curve[0], curve[-1]
    assert after >= before + 0.05, f"vLLM's answers did not improve with the swapped-in weights: {curve}"

    trainer = [r for r in rows(run_dir, "on-policy", "trainer") if "ratio_min" in r]
    assert len(trainer) >= ON_POLICY_STEPS and all(r["staleness_max"] == 0 for r in trainer)
    worst = max(max(abs(r["ratio_min"] - 1), abs(r["ratio_max"] - 1)) for r in trainer)
    print(f"on-policy PPO ratios over {len(trainer)} steps: max |ratio - 1| = {worst:.2e}")
    assert worst <= 1e-3
