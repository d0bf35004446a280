"""`undertow run` with `rollout.engine: vllm`: the workers run in the vLLM environment, the trainer in
this one, and on-policy every importance ratio the trainer computes is 1 (its recomputed log-probs
equal vLLM's, after every hot-swap). (tests/vllm covers `init_from`, which a later stage starts from.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from infra.metrics_log import read_metrics
from infra.rollout_env import vllm_python
from tests.run_output import wait_run
from tests.vllm.tiny_llama import save_tiny_llama

pytestmark = [pytest.mark.broker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


def test_a_run_with_the_vllm_engine_trains_on_policy_with_ratio_one(tmp_path):
    vllm_python()  # without the vLLM environment this fails, naming `bash infra/bootstrap.sh --vllm`
    model = save_tiny_llama(tmp_path / "tiny-llama")
    config = {
        "namespace": "vllm-run", "model": {"source": "hf", "path": str(model)},
        "feeder": {"tasksets": [{"name": "sums", "source": {"name": "sums", "size": 1000}}], "epochs": None,
                   "group_size": 4, "max_lag": 8},
        "rollout": {"engine": {"name": "vllm", "max_model_len": 64}, "chat_template": False,
                    "sampling": {"temperature": 1.0, "max_new_tokens": 4}, "reward": "numeric_match",
                    "max_staleness": 0},
        "processors": {"pipeline": ["clean", {"name": "reshape", "advantage": "grpo"}]},
        "trainer": {"engine": {"lr": 1.0e-3}, "batching": {"experiences": 16, "max_staleness": 0, "max_wait_s": 2.0},
                    "algorithm": {"objective": "rl", "policy_loss": "ppo_clip"}, "sync_every": 1,
                    "checkpoint_every": 50},
        "run": {"name": "vllm", "steps": 6},
    }
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    runs = tmp_path / "runs"
    proc = subprocess.Popen([sys.executable, "-m", "infra.cli", "run", str(path), "--runs-dir", str(runs), "--no-live"],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    wait_run(proc, runs, timeout=420)
    (run_dir,) = list(runs.iterdir())
    assert json.loads((run_dir / "run.json").read_text())["status"] == "done"
    rollout_log = next(run_dir.glob("logs/*/rollout.log")).read_text()
    assert "vllm" in rollout_log.lower()  # the engine really was vLLM's
    rows = [r for r in read_metrics(run_dir / "metrics.jsonl")
            if r["component"] == "trainer" and "ratio_min" in r]
    assert len(rows) >= 6
    worst = max(max(abs(r["ratio_min"] - 1), abs(r["ratio_max"] - 1)) for r in rows)
    print(f"on-policy PPO ratios over {len(rows)} steps: max |ratio - 1| = {worst:.2e}")
    assert worst <= 1e-3
