"""Weights & Biases: offline by default (files under <run dir>/wandb/, `wandb sync` uploads them later)."""

from __future__ import annotations

import os
import re
from itertools import groupby
from typing import Literal

from undertow.infra.monitor.sinks import Scalar, SinkContext, needs_extra, sinks

STEP = "policy_version"


@sinks.register("wandb")
class WandbSink:
    """One W&B run per stage, grouped by the run's name; every metric plotted against the policy version."""

    def __init__(self, context: SinkContext, *, project: str = "undertow", entity: str | None = None,
                 mode: Literal["offline", "online", "disabled"] = "offline"):
        os.environ.setdefault("WANDB_SILENT", "true")  # its banner would fill the monitor's log
        with needs_extra("wandb"):
            import wandb
        # The same id on a restart: the stage's records stay one run when synced.
        run_id = re.sub(r"[^A-Za-z0-9_-]", "-", f"{context.run}-{context.stage}")
        self.run = wandb.init(project=project, entity=entity, mode=mode, dir=str(context.directory),
                              id=run_id, resume="allow", group=context.run, name=context.stage,
                              config={"namespace": context.namespace, "stage": context.stage},
                              settings=wandb.Settings(console="off", x_disable_stats=True))
        # W&B's own step must only grow; versions do not across components (a worker reports the
        # version it holds, behind the trainer's), so the version is a custom x-axis instead.
        self.run.define_metric(STEP)
        self.run.define_metric("*", step_metric=STEP)

    def write(self, scalars: list[Scalar]) -> None:
        for (step, _), same in groupby(scalars, key=lambda s: (s.step, s.time)):
            self.run.log({STEP: step, **{s.tag: s.value for s in same}})

    def flush(self) -> None:
        pass  # run.log hands each row to W&B's own service process, which writes it even if we die

    def close(self) -> None:
        self.run.finish()
