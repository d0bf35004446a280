"""The `processors` section of a run config; its pipeline's names and arguments are checked as it loads."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DEFAULT_PIPELINE: list[Any] = ["clean", "reshape", "prioritize"]


def processors_group(namespace: str, app_id: str | None = None) -> str:
    """The processors' Faust app id, hence their consumer group on the raw topic: the config's `app_id`,
    else the namespace's."""
    return app_id or f"{namespace}-processors"


class ProcessorsConfig(BaseModel):
    """How the processor stage reads, transforms and writes experiences."""

    model_config = ConfigDict(extra="forbid")

    pipeline: list[str | dict[str, Any]] = Field(
        default_factory=lambda: list(DEFAULT_PIPELINE),
        description="processors in order: a name, a dotted path, or {name: …, **kwargs}")
    app_id: str | None = Field(None, description="Faust app id, hence the consumer group; workers with the same id "
                                                 "share partitions (default: <namespace>-processors)")
    group_timeout_s: float = Field(60.0, gt=0, description="seconds a prompt group may wait for its missing samples")
    on_timeout: Literal["emit", "reject"] = Field(
        "emit", description="what happens to a group that timed out: emit it partial, or reject its samples")
    max_open_groups: int = Field(100_000, ge=1, description="open groups kept at most; the oldest close first")
    batch_size: int = Field(256, ge=1, description="records taken from the stream per pipeline call")
    batch_within_s: float = Field(0.01, gt=0, description="longest wait to fill a batch, in seconds")
    tick_every_s: float = Field(1.0, gt=0, description="how often timed-out groups are looked for")
    metrics_every_s: float = Field(5.0, gt=0, description="how often per-stage counters go to the metrics topic")
    stage_timeout_s: float | None = Field(
        10.0, gt=0, description="longest wait for one processor call (a plugin, a data-juicer op) on a batch or a "
                                "record; a record whose call takes longer is rejected with reason `timeout` (a "
                                "model scorer keeps its own timeout_s); None: no limit")
    max_hung_calls: int = Field(
        8, ge=1, description="processor calls left hanging past stage_timeout_s (Python cannot stop their threads) "
                             "before the worker commits and exits to be restarted fresh")
    stall_timeout_s: float = Field(
        120.0, gt=0, description="a worker whose start-up or batch takes longer exits (code 75) to be restarted")
    stop_timeout_s: float = Field(
        30.0, gt=0, description="a worker whose stop (SIGTERM, SIGINT) takes longer prints where it waits and exits "
                                "(code 75); under `undertow run` keep it below the 60 s the run waits for a component")
    resync_after_s: float = Field(
        15.0, gt=0, description="a partition whose records wait while the whole worker was offered nothing and "
                            "handled nothing this long is read again from its next offset (a backlog of "
                            "other partitions never counts: see streams/faust/delivery.py)")
    idle_exit_s: float | None = Field(
        None, gt=0, description="stop after this many seconds without a record (tests, benchmarks); None: run until SIGTERM")

    @model_validator(mode="after")
    def _deadline_fits_the_watchdog(self) -> "ProcessorsConfig":
        from undertow.processors.pipeline import HANGS_PER_BATCH

        # A batch may wait its call's deadline and then one per record that hangs again, up to the cap;
        # with twice that to spare, the watchdog never restarts a worker for a hung plugin.
        if self.stage_timeout_s is not None and 2 * (HANGS_PER_BATCH + 1) * self.stage_timeout_s > self.stall_timeout_s:
            raise ValueError(f"stage_timeout_s: {self.stage_timeout_s:g} s is too long for stall_timeout_s "
                             f"{self.stall_timeout_s:g} s: at most stall_timeout_s / {2 * (HANGS_PER_BATCH + 1)}")
        return self

    @field_validator("pipeline")
    @classmethod
    def _pipeline_builds(cls, entries: list[str | dict[str, Any]]) -> list[str | dict[str, Any]]:
        from undertow.processors.pipeline import Pipeline  # the stages' module imports this one's siblings

        try:  # unknown names and wrong arguments fail here, before a broker or a process starts
            Pipeline.from_config(entries)
        except (TypeError, RuntimeError) as e:
            raise ValueError(str(e)) from None
        return entries
