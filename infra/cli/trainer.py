"""`undertow train CONFIG`: the DeepSpeed trainer on `<namespace>.experiences.ready`."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

import typer

from undertow.infra.cli.common import component, console, user_errors


def train(config: Path = typer.Argument(..., exists=True, dir_okay=False, help="Run config (YAML)."),
          max_steps: Optional[int] = typer.Option(None, help="Stop after this many optimizer steps in total."),
          idle_timeout: Optional[float] = typer.Option(None, help="Stop after this many seconds without data."),
          nproc: int = typer.Option(1, min=1, help="Data-parallel trainer processes on this machine (torchrun)."),
          shadow: Optional[str] = typer.Option(
              None, help="Train the config's shadow NAME (shadows:) on the same experiences, into its own topics."),
          ) -> None:
    """Train on ready experiences until SIGTERM / Ctrl-C (or a budget); checkpoint and publish on the way out."""
    from undertow.streams import create_topics
    from undertow.trainer.runner import Budget, run

    with user_errors():
        cfg, context = component(config)  # a bad config fails here, before any process starts
        trainer = cfg.trainer if shadow is None else cfg.shadow_trainer(shadow)
        if nproc > 1 and "LOCAL_RANK" not in os.environ:
            _exec_torchrun(nproc, [str(config), *(["--max-steps", str(max_steps)] if max_steps else []),
                                   *(["--idle-timeout", str(idle_timeout)] if idle_timeout else []),
                                   *(["--shadow", shadow] if shadow else [])])
        if shadow is not None:  # a shadow started by hand on a run's log needs its own topics
            context = context.model_copy(update={"shadow": shadow})
            if "LOCAL_RANK" not in os.environ or os.environ["LOCAL_RANK"] == "0":
                create_topics(context.kafka, context.namespace, shadow=shadow)
        state = run(trainer, context, Budget(max_steps, idle_timeout))
        console.print(f"trainer stopped at step {state.step} (published version {state.published_version})")


def _exec_torchrun(nproc: int, args: list[str]) -> None:
    """Become torchrun (same pid, so a supervisor's SIGTERM reaches it; it passes it to every rank)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           "-m", "undertow.infra.cli", "train", *args]
    os.execv(sys.executable, cmd)
