"""The whole loop through the real broker: the demo (run once per session, tests/conftest.py) learns and
every README command works on its run directory; Ctrl-C leaves a checkpoint that --resume continues."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from undertow.infra.report.metrics_log import read_metrics
from tests.run_output import demo_config, only_run_dir, undertow_run, wait_for_step, wait_run

pytestmark = [pytest.mark.broker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
# README commands that start long work of their own instead of looking at the finished demo run.
NOT_ON_A_FINISHED_RUN = {
    "run": "starts a run: the demo is that run, and --resume is test_ctrl_c_checkpoints_and_resume_continues",
    "monitor": "runs until SIGTERM, on a config of its own (tests/infra/test_monitor.py)",
    "archive": "runs until SIGTERM; the demo archived itself (run.archive)",
    "broker": "starts or stops this machine's broker, not the run's (tests/infra/test_broker_cli.py)",
    "serve": "serves until SIGTERM (tests/rollout/test_serve_broker.py drives its endpoint)",
    "--follow": "follows its topic until Ctrl-C",
}


def trainer_rows(run_dir: Path, stage: str) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("stage") == stage and r["component"] == "trainer"]


def eval_rows(run_dir: Path, stage: str) -> list[dict]:
    return [r for r in read_metrics(run_dir / "metrics.jsonl") if r.get("stage") == stage and r["component"] == "eval"]


@pytest.mark.timeout(900)  # the demo (~3-7 min, by load) is run in the first test that needs it
def test_demo_learns_through_the_broker(demo):
    run_dir, out = demo.run_dir, demo.out
    assert json.loads((run_dir / "run.json").read_text())["status"] == "done"
    # Greedy accuracy on all 100 one-digit sums (the training problems: accuracy on the task, its
    # contamination measured at 100%), from the weights RL starts from to its last.
    evals = eval_rows(run_dir, "rl")
    first, last = evals[0], evals[-1]
    assert (first["version"], last["version"]) == (0, 900)
    before, after = first["sums-all/greedy_accuracy"], last["sums-all/greedy_accuracy"]
    print(f"greedy accuracy: {before:.2f} -> {after:.2f}; curve "
          f"{[(int(r['version']), r['sums-all/greedy_accuracy']) for r in evals]}")
    # Runs here went 0.23 -> 0.44 (300 steps, constant lr) and 0.37 -> 0.78 (the demo's 900 steps,
    # cosine); 100 sums put the binomial noise of one evaluation at ±0.05.
    assert after >= before + 0.2, f"accuracy did not rise: {before:.2f} -> {after:.2f}"
    rewards = [r["reward_mean"] for r in trainer_rows(run_dir, "rl") if "reward_mean" in r]
    assert len(rewards) >= 800
    assert sum(rewards[-90:]) / 90 >= sum(rewards[:90]) / 90 + 0.15
    assert first["sums-all/contamination"] == 1.0  # measured: training draws every one of the 100 sums
    assert "stage rl: eval sums-all/greedy_accuracy" in out and "100% of its prompts are training prompts" in out
    assert "stage rl: done" in out and (run_dir / "checkpoints" / "demo-rl").is_dir()
    # Not on a terminal, the run writes one progress line every run.log_every_s (30 s) per stage, not
    # a refresh of the live view: the log grows with the run's length only.
    seconds = [int(s) for s in re.findall(r"stage \S+: done in (\d+)s", out)]
    progress = [line for line in out.splitlines() if line.startswith(("[warmup]", "[rl]"))]
    assert len(seconds) == 2 and 2 <= len(progress) <= sum(s // 30 + 2 for s in seconds), out
    assert len(out.splitlines()) <= len(progress) + 30, out


def readme_commands(run_dir: Path) -> list[list[str]]:
    """Every `undertow ...` line of the README's bash blocks, with the demo's run directory in it."""
    text = (ROOT / "README.md").read_text().replace("runs/demo-<time>", str(run_dir))
    lines = [line for block in re.findall(r"```bash\n(.*?)```", text, re.S) for line in block.splitlines()]
    return [shlex.split(line, comments=True)[1:] for line in lines if line.startswith("undertow ")]


@pytest.mark.timeout(900)
def test_every_readme_command_runs_on_the_finished_demo(demo):
    ran = []
    for args in readme_commands(demo.run_dir):
        if any(word in NOT_ON_A_FINISHED_RUN for word in args[:1] + [a for a in args if a.startswith("--")]):
            continue
        proc = subprocess.run([sys.executable, "-m", "undertow.infra.cli", *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1", "COLUMNS": "200"})  # rich's tables unwrapped
        assert proc.returncode == 0, f"undertow {shlex.join(args)}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
        ran.append((args, proc.stdout))
    assert len(ran) >= 14, [a for a, _ in ran]  # the README's look-at-a-run commands, none lost to parsing
    outputs = {a[0] + (" " + a[1] if a[0] == "config" else ""): o for a, o in ran}
    assert "index.html" in outputs["report"] and "sums-all" in outputs["eval"] and "ok" in outputs["config check"]
    page = (demo.run_dir / "report" / "index.html").read_text()
    assert 'id="samples"' in page and "no-archive" not in page  # the demo archives: the page shows its samples
    assert "experiences" in outputs["status"] and "replayed" in outputs["replay"] and "pass_rate" in outputs["query"]
    # The demo's last 50 steps trained again from its archive: the same weights, bit for bit.
    assert "identical to the run's checkpoint" in " ".join(outputs["retrain"].split()), outputs["retrain"]


def test_ctrl_c_checkpoints_and_resume_continues(tmp_path):
    # No evaluator and no archive: two processes the test asserts nothing about, on two busy cores.
    config = demo_config(tmp_path, without=("eval",), stages=[], steps=40, archive=False)
    runs = tmp_path / "runs"
    proc = undertow_run(str(config), "--runs-dir", str(runs))
    wait_for_step(proc, runs, 8)
    proc.send_signal(signal.SIGINT)
    out = wait_run(proc, runs, timeout=240, code=130)
    run_dir = only_run_dir(runs)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    checkpoints = sorted((run_dir / "checkpoints" / "demo").glob("step-*"))
    assert checkpoints, "Ctrl-C left no checkpoint"
    stopped_at = int(checkpoints[-1].name.split("-")[1])
    assert 8 <= stopped_at < 40
    assert f"undertow run --resume {run_dir}" in out

    resumed = undertow_run("--resume", str(run_dir))
    wait_run(resumed, runs, timeout=300)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "done"
    steps = [r["version"] for r in trainer_rows(run_dir, "main")]
    assert max(steps) == 40
    after = [s for s in steps if s > stopped_at]
    assert after and min(after) == stopped_at + 1  # continued from the checkpoint, not from scratch


def test_bad_config_is_a_clear_error_and_starts_nothing(tmp_path):
    cfg = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    cfg["trainer"]["batching"]["max_stalenes"] = 1
    cfg["rollout"]["sampling"]["temperature"] = -1
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = undertow_run(str(path), "--runs-dir", str(tmp_path / "runs"))
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 2
    assert "trainer.batching.max_stalenes" in out and "rollout.sampling.temperature" in out
    assert "greater than 0" in out and "Traceback" not in out
    assert not (tmp_path / "runs").exists()


def test_smollm2_config_runs_a_step_on_cpu(tmp_path):
    """The real small LLM (GGUF from PyPI) through the whole loop: one step, shortened generations."""
    cfg = yaml.safe_load((ROOT / "examples" / "smollm2_gsm.yaml").read_text())
    cfg["feeder"]["group_size"] = 2
    cfg["rollout"]["sampling"]["max_new_tokens"] = 8
    cfg["trainer"]["batching"]["experiences"] = 2
    cfg["run"]["steps"] = 1
    path = tmp_path / "smollm2.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = undertow_run(str(path), "--runs-dir", str(tmp_path / "runs"))
    wait_run(proc, tmp_path / "runs", timeout=540)
    run_dir = only_run_dir(tmp_path / "runs")
    rows = trainer_rows(run_dir, "main")
    assert rows and rows[-1]["version"] == 1 and rows[-1]["tokens"] > 0
    export = sorted((run_dir / "checkpoints" / "smollm2").glob("step-*/hf/config.json"))
    assert export and '"llama"' in export[-1].read_text()  # the real SmolLM2 architecture was trained
