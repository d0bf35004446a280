"""`undertow process CONFIG [--workers N]`: the stream processors (experiences.raw -> experiences.ready)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import typer

from undertow.infra.cli.common import component, console, user_errors


def process(config: Path = typer.Argument(..., exists=True, dir_okay=False, help="YAML run config."),
            workers: int = typer.Option(1, min=1, help="Worker processes sharing the partitions (same app id)."),
            idle_exit: Optional[float] = typer.Option(None, help="Stop after this many seconds without a record."),
            worker_name: Optional[str] = typer.Option(None, hidden=True)) -> None:
    """Run the processor pipeline until SIGTERM/SIGINT."""
    with user_errors():
        run, context = component(config)  # the pipeline's names and arguments fail here, before Kafka
        cfg = run.processors
        if idle_exit is not None:
            cfg = cfg.model_copy(update={"idle_exit_s": idle_exit})
        if workers == 1:  # a topic missing or not this login's to read ends it in one line, as it ends the others
            from undertow.processors.runner import run_worker

            run_worker(cfg, context, worker_name)
            return
    raise typer.Exit(run_children(config, workers, idle_exit, cfg.stop_timeout_s))


def run_children(config: Path, workers: int, idle_exit: Optional[float], stop_timeout_s: float) -> int:
    """Start `workers` single-worker processes; pass SIGTERM/SIGINT on; return the worst exit code. A
    child still running `stop_timeout_s` (its own limit) and 15 s more after the signal is killed."""
    extra = ["--idle-exit", str(idle_exit)] if idle_exit is not None else []
    children = [subprocess.Popen([sys.executable, "-m", "undertow.infra.cli", "process", str(config), "--workers", "1",
                                  "--worker-name", f"worker-{i}", *extra]) for i in range(workers)]
    console.print(f"started {workers} processor workers: pids {[c.pid for c in children]}")
    signalled: list[float] = []

    def forward(signum: int, _frame: object) -> None:
        signalled.append(time.monotonic())
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    while any(child.poll() is None for child in children):
        if signalled and time.monotonic() - signalled[0] > stop_timeout_s + 15:
            for child in children:
                if child.poll() is None:
                    console.print(f"processor worker {child.pid} still running {stop_timeout_s + 15:g} s after the "
                                  "signal: killed")
                    child.kill()
        time.sleep(0.2)
    return max((child.wait() for child in children), key=abs)
