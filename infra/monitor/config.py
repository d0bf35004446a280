"""`monitor:` — which metric sinks the monitor writes to, and where."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from undertow.kernel.registry import checked_entry
from undertow.infra.monitor.sinks import sinks


class MonitorConfig(BaseModel):
    """The metrics topic, written to TensorBoard, W&B, MLflow or a user's sink (`undertow monitor`)."""

    model_config = ConfigDict(extra="forbid")

    sinks: list[str | dict[str, Any]] = Field(
        default_factory=list, description="sinks by name or {name: …, **arguments}: tensorboard, wandb, mlflow, "
                                          "or a dotted path to a class; none: `undertow run` starts no monitor")
    dir: str = Field("runs/monitor", description="where file-based sinks write (`undertow run`: the run directory)")
    run: str | None = Field(None, description="the run's name in the sinks (`undertow run`: its directory's name; "
                                              "else the namespace)")
    stage: str = Field("main", description="the stage label: one TensorBoard / W&B / MLflow run per stage")
    lag_every_s: float | None = Field(
        10.0, gt=0, description="how often the consumer groups' lag and the trainer's wait fraction go to the "
                                "metrics topic (component `lag`, infra/monitor/lag.py); none: never")
    drain_s: float = Field(15.0, ge=0, description="on SIGTERM, how long to go on writing what is already on the topic")

    @field_validator("sinks")
    @classmethod
    def _sinks_resolve(cls, entries: list[Any]) -> list[Any]:
        return [checked_entry(sinks, e) for e in entries]
