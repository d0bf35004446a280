"""Waiting for an `undertow run` subprocess, with every component's log in the failure message."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path

import pytest


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
