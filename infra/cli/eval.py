"""`undertow eval CONFIG`: held-out evaluation, following the weights topic or on one checkpoint."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from undertow.infra.cli.common import BootstrapOpt, console, context_of, run_config, user_errors


def eval_command(config: Path = typer.Argument(..., exists=True, dir_okay=False, help="The run's YAML config."),
                 checkpoint: Optional[Path] = typer.Option(
                     None, exists=True, file_okay=False,
                     help="Score this HF directory or trainer checkpoint (step-N/) once, print a table, exit."),
                 bootstrap: Optional[str] = BootstrapOpt,
                 shadow: Optional[str] = typer.Option(
                     None, help="Follow the weights of the config's shadow trainer NAME instead of the run's.")) -> None:
    """Score `eval.tasksets` on each eval.every-th policy version until SIGTERM, or once on --checkpoint."""
    from undertow.rollout.eval_runner import evaluate_checkpoint, follow

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with user_errors():
        cfg = run_config(config)
        if not cfg.eval.tasksets:
            raise ValueError("eval.tasksets: the config names no held-out taskset")
        if checkpoint is not None:  # no broker needed
            print_table(evaluate_checkpoint(cfg.eval, cfg.rollout, cfg.model, checkpoint))
            return
        context = context_of(cfg, bootstrap)
        if shadow is not None:
            cfg.shadow_trainer(shadow)  # the name must be one of the config's shadows
            context = context.model_copy(update={"shadow": shadow})
        stop = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
        done = follow(cfg.eval, cfg.rollout, context, stop, training=cfg.feeder.tasksets)
        console.print(f"eval: versions {done} evaluated")


def print_table(results) -> None:
    ks = sorted({k for r in results for k in r.pass_at}, key=lambda k: int(k.split("@")[1]))
    table = Table("taskset", "version", "tasks", "greedy accuracy", *ks, "mean reward", "mean length", "seconds")
    for r in results:
        table.add_row(r.taskset, str(r.version), str(r.tasks),
                      "—" if r.greedy_accuracy is None else f"{r.greedy_accuracy:.3f}",
                      *(f"{r.pass_at[k]:.3f}" if k in r.pass_at else "—" for k in ks),
                      f"{r.mean_reward:.3f}", f"{r.mean_response_tokens:.1f}", f"{r.seconds:.1f}")
    console.print(table)
