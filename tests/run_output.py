"""Starting an `undertow run` subprocess and waiting for it, with every component's log in the failure message."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from undertow.infra.report.metrics_log import read_metrics
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class DemoRun:
    """A finished `undertow run examples/demo.yaml`: its run directory and its output."""

    run_dir: Path
    out: str


def demo_config(tmp_path: Path, without: tuple[str, ...] = (), **run: object) -> Path:
    """examples/demo.yaml with `run` settings replaced and the sections `without` left out, written
    under `tmp_path`."""
    cfg = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    cfg["run"].update(run)
    for section in without:
        del cfg[section]
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def undertow_run(*args: str, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "undertow.infra.cli", "run", *args, "--no-live"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def only_run_dir(runs: Path) -> Path:
    (run_dir,) = list(runs.iterdir())
    return run_dir


def component_logs(runs: Path, tail: int = 2500) -> str:
    """The end of each component's log under a runs directory: what a failed run's message needs."""
    return "\n".join(f"--- {log}\n{log.read_text(errors='replace')[-tail:]}" for log in sorted(runs.glob("*/logs/*/*.log")))


def stop_run(proc: subprocess.Popen, grace: float = 60.0) -> str:
    """Ctrl-C a run still going (it stops its components in order), kill it after `grace` s; its output."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out or ""


def wait_run(proc: subprocess.Popen, runs: Path, timeout: float, code: int = 0) -> str:
    """The run's output once it exits with `code`; a run still going after `timeout` s is stopped
    (`stop_run`) and fails the test with its output and its components' logs."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out = stop_run(proc)
        pytest.fail(f"undertow run did not finish in {timeout:.0f} s\n{out[-3000:]}\n{component_logs(runs)}")
    assert proc.returncode == code, f"{out[-3000:]}\n{component_logs(runs)}"
    return out


def trained_to(runs: Path, step: int) -> Path | None:
    """The run directory under `runs` once its trainer has reported `step` (any stage), else None."""
    for run_dir in runs.glob("*"):
        if any(r["component"] == "trainer" and r.get("version", 0) >= step for r in read_metrics(run_dir / "metrics.jsonl")):
            return run_dir
    return None


def wait_for_step(proc: subprocess.Popen, runs: Path, step: int, timeout: float = 300) -> Path:
    """The run directory once the run's trainer has reported `step`; fails with the run's output if it
    exits first, or with every component's log if `timeout` s pass."""
    return wait_for(lambda: trained_to(runs, step), timeout, f"the trainer to reach step {step}", proc=proc,
                    state=lambda: component_logs(runs), every=0.5)
