"""`undertow feed CONFIG` and `undertow rollout CONFIG [--workers N]`: the rollout stage's commands."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer

from undertow.infra.cli.common import BootstrapOpt, component, console, user_errors

rollout_cli = typer.Typer()

ConfigArg = typer.Argument(..., help="The run's YAML config.", exists=True, dir_okay=False)


@rollout_cli.command("rollout")
def rollout(config: Path = ConfigArg,
            workers: Optional[int] = typer.Option(None, "--workers", "-w", min=1,
                                                  help="Worker processes in one consumer group (default: rollout.workers)."),
            max_tasks: Optional[int] = typer.Option(None, min=1, help="Stop each worker after this many tasks."),
            idle_timeout: Optional[float] = typer.Option(None, min=0, help="Stop a worker idle this many seconds."),
            bootstrap: Optional[str] = BootstrapOpt) -> None:
    """Turn tasks into experiences until SIGTERM (or a budget): generate, score, publish, commit."""
    from undertow.rollout.main import run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with user_errors():
        cfg, context = component(config, bootstrap)
        done = run(cfg.rollout, context, workers=workers, max_tasks=max_tasks, idle_timeout=idle_timeout)
        console.print(f"rollout: {done} task(s) done")


@rollout_cli.command("feed")
def feed(config: Path = ConfigArg,
         max_tasks: Optional[int] = typer.Option(None, min=1, help="Stop after publishing this many tasks."),
         bootstrap: Optional[str] = BootstrapOpt) -> None:
    """Publish tasks to <namespace>.tasks until the tasksets run out, SIGTERM, or --max-tasks."""
    from undertow.rollout.main import feed as run_feed

    with user_errors():
        cfg, context = component(config, bootstrap)
        published = run_feed(cfg.feeder, context, max_tasks=max_tasks)
        console.print(f"feed: {published} task(s) published")

