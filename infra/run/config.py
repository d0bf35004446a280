"""The one model of a run file: the shared header (namespace, kafka, model), one section per
component, and the run's own settings. `undertow run` and every component command read it."""

from __future__ import annotations

import copy
import os
import warnings
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from undertow.kernel.config_io import ConfigError, deep_merge, load_yaml, validation_message
from undertow.infra.algorithms import expand, presets
from undertow.infra.run.rules import problems
from undertow.infra.run.supervisor import ROLES, cpu_list
from undertow.kernel.registry import RegistryError, checked_entry
from undertow.infra.monitor import MonitorConfig
from undertow.processors.config import ProcessorsConfig
from undertow.rollout.config import EvalConfig, FeederConfig, RolloutConfig
from undertow.rollout.serve.config import ServeConfig
from undertow.kernel.models import ModelSpec
from undertow.streams import NAMESPACE_PATTERN, KafkaSettings, TopicsConfig
from undertow.streams.topics import IdleWorkers, idle_workers
from undertow.streams.access import Quota
from undertow.streams.archive import ArchiveConfig
from undertow.streams.weights.api import transport_of
from undertow.trainer.config import TrainerConfig
from undertow.watchers.config import Entry as WatcherEntry, checked_watchers

SECTIONS = ("model", "feeder", "rollout", "processors", "trainer")


class ShadowConfig(BaseModel):
    """A shadow trainer: a second trainer on the run's ready topic, its own consumer group, weights,
    checkpoints and evaluations; it trains on every experience the run's trainer reads and steers no
    rollout. It differs from the run's trainer by `trainer` overrides (loss, aggregation, KL, lr, epochs…);
    the processors (advantage, shaping, filters) are the stream's, shared by both."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$", description="its topics are <namespace>.shadow-<name>.*")
    trainer: dict[str, Any] = Field(default_factory=dict, description="overrides of the trainer section")


class RunStage(BaseModel):
    """One stage of a multi-stage run (e.g. an SFT warm-up, then RL): its length and what it changes."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_-]+$", description="stage name: its topics are <namespace>-<name>.*")
    steps: int = Field(ge=1, description="trainer steps in this stage")
    algorithm: str | dict[str, Any] | None = Field(None, description="this stage's algorithm preset (None: the run's)")
    model: dict[str, Any] = Field(default_factory=dict, description="overrides of the model section")
    feeder: dict[str, Any] = Field(default_factory=dict, description="overrides of the feeder section")
    rollout: dict[str, Any] = Field(default_factory=dict, description="overrides of the rollout section")
    processors: dict[str, Any] = Field(default_factory=dict, description="overrides of the processors section")
    trainer: dict[str, Any] = Field(default_factory=dict, description="overrides of the trainer section")
    shadows: list[ShadowConfig] | None = Field(None, description="this stage's shadow trainers (None: the run's)")


class RestartPolicy(BaseModel):
    """`run.restarts:` — a crashed component is restarted unless it crashed too often lately.

    A rate, not a lifetime count: a run meant to last days survives any number of crashes spread
    over time, and fails only when one component crashes more than `max` times within `window_s`.
    """

    model_config = ConfigDict(extra="forbid")

    max: int = Field(5, ge=0, description="crashes of one component allowed within window_s; "
                                          "one more fails the run (0: the first crash does)")
    window_s: float = Field(600.0, gt=0, description="the sliding window crashes are counted in, seconds")
    backoff_s: float = Field(1.0, ge=0, description="wait before restarting after a crash; doubles with "
                                                    "each further crash of that component in the window")
    backoff_max_s: float = Field(30.0, ge=0, description="longest wait before a restart")


class RunSection(BaseModel):
    """`run:` — how `undertow run` supervises the stages."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("run", pattern=r"^[A-Za-z0-9_-]+$", description="run name: prefix of the run directory")
    dir: str = Field("runs", description="where run directories are made")
    steps: int | None = Field(None, ge=1, description="trainer steps of a single-stage run (null: until Ctrl-C)")
    stages: list[RunStage] = Field(default_factory=list, description="stages run in order; empty: one stage")
    processor_workers: int = Field(1, ge=1, description="Faust processor workers")
    trainer_processes: int = Field(1, ge=1, description="data-parallel trainer ranks (`undertow train --nproc`)")
    live: bool = Field(True, description="show the live view in the terminal")
    refresh_s: float = Field(1.0, gt=0, description="live view refresh period")
    log_every_s: float = Field(30.0, gt=0, description="not on a terminal (a log file, CI, nohup): one progress "
                                                        "line every this many seconds instead of the live view")
    archive: bool = Field(False, description="also run `undertow archive` (the archive section) beside each stage")
    restarts: RestartPolicy = Field(default_factory=RestartPolicy,
                                    description="restart policy; an int N is short for {max: N} (older configs)")
    idle_timeout_s: float | None = Field(None, gt=0, description="finite tasksets: once all are published, end the "
                                                                  "stage when the trainer has not stepped this long")
    cpus: dict[str, str] = Field(default_factory=dict, description=(
        "pin components to CPUs, taskset-style: {trainer: \"0\", rollout: \"1-3\"} (keys: " + ", ".join(ROLES) +
        "; a shadow trainer or evaluator follows its role); unnamed components run anywhere"))

    @field_validator("cpus")
    @classmethod
    def _cpus_exist(cls, value: dict[str, str]) -> dict[str, str]:
        usable = os.sched_getaffinity(0)
        for name, spec in value.items():
            if name not in ROLES:
                raise ValueError(f"cpus: {name!r} is not a component (one of {', '.join(ROLES)})")
            missing = sorted(cpu_list(spec) - usable)  # cpu_list raises on bad syntax
            if missing:
                raise ValueError(f"cpus.{name}: CPU {missing} not usable here (this process may use {sorted(usable)})")
        return value

    @field_validator("restarts", mode="before")
    @classmethod
    def _count_is_a_max(cls, value: Any) -> Any:
        # Configs written before the policy was a rate said `restarts: 3`; bool is an int too, refuse it.
        if isinstance(value, int) and not isinstance(value, bool):
            return {"max": value}
        return value


# The principals `undertow acls` grants (infra/run/access.py), by component; shadows add `shadow-<name>`.
PRINCIPALS = ("feeder", "rollout", "processors", "trainer", "eval", "archive", "monitor", "watchers", "serve",
              "operator")


class AccessConfig(BaseModel):
    """`access:` — who logs in as whom (README, "Least privilege on the log")."""

    model_config = ConfigDict(extra="forbid")

    per_component: bool = Field(False, description=(
        "`undertow run` logs each component in as its own SCRAM-SHA-512 user, User:<namespace>-<component>, with "
        "a fresh password at every start and only the ACLs `undertow acls` prints; the config's own login is the "
        "operator's (a super user) and no component sees it. No cluster configured: the run's own broker is "
        "started with an authorizer"))
    login: Literal["scram", "certificate"] = Field("scram", description=(
        "how each component proves who it is under per_component: a SCRAM-SHA-512 password, or a client "
        "certificate (mutual TLS) whose CN is its user, signed by a CA the run's own broker makes at every start "
        "(a certificate from an earlier start no longer logs in)"))
    quotas: dict[str, Quota] = Field(default_factory=dict, description=(
        "byte-rate quotas by component ({rollout: {produce_bytes_per_s: 1.0e+6}}), set with the ACLs (`undertow "
        "acls --apply`, and `undertow run` with per_component)"))

    @property
    def certificates(self) -> bool:
        """Each component logs in with a client certificate the run issues."""
        return self.per_component and self.login == "certificate"

    @field_validator("quotas")
    @classmethod
    def _components(cls, value: dict[str, Quota]) -> dict[str, Quota]:
        for name in value:
            if name not in PRINCIPALS and not name.startswith("shadow-"):
                raise ValueError(f"quotas: {name!r} is not a component (one of {', '.join(PRINCIPALS)}, shadow-<name>)")
        return value


class RunConfig(BaseModel):
    """A whole run: cluster, model, each stage's section, and the run's own settings."""

    model_config = ConfigDict(extra="forbid")

    namespace: str = Field("undertow", pattern=NAMESPACE_PATTERN, description="topic namespace (stages add -<stage name>)")
    algorithm: str | dict[str, Any] | None = Field(None, description=(
        "an algorithm preset (infra/algorithms/, e.g. grpo, dapo, ppo, reinforce_pp; a dotted path; or {name: …, "
        "**options}): the processors' advantage and the trainer's loss in one place; what the sections set "
        "explicitly overrides it (`undertow algorithms` lists every one and what it sets)"))
    kafka: KafkaSettings = Field(default_factory=KafkaSettings, description="brokers; none: a local one is started")
    model: ModelSpec = Field(default_factory=ModelSpec, description="the policy model")
    topics: TopicsConfig = Field(default_factory=TopicsConfig, description="partitions and replication of the "
                                 "namespace's topics (README, \"Scaling out\")")
    feeder: FeederConfig = Field(default_factory=FeederConfig, description="the task feeder")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="the rollout workers")
    serve: ServeConfig = Field(default_factory=ServeConfig, description="`undertow serve`: batching, session expiry")
    processors: ProcessorsConfig = Field(default_factory=ProcessorsConfig, description="the stream processors")
    trainer: TrainerConfig = Field(default_factory=TrainerConfig, description="the trainer")
    archive: ArchiveConfig = Field(default_factory=ArchiveConfig, description="the Parquet archive (with run.archive)")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="held-out evaluation; `undertow run` starts "
                                                                     "`undertow eval` when it names tasksets")
    monitor: MonitorConfig = Field(default_factory=MonitorConfig, description="metric sinks; `undertow run` starts "
                                                                              "`undertow monitor` when it names any")
    watchers: list[WatcherEntry] = Field(default_factory=list, description="stream watchers (a name, a dotted path, "
                                         "or {name: …, **kwargs}); `undertow run` starts `undertow watch` when it names any")
    shadows: list[ShadowConfig] = Field(default_factory=list, description=(
        "shadow trainers: other trainer settings trained on the same experiences, each evaluated beside the run's "
        "trainer (`undertow train CONFIG --shadow NAME`; `undertow run` starts them)"))
    run: RunSection = Field(default_factory=RunSection, description="supervision")
    access: AccessConfig = Field(default_factory=AccessConfig, description="one login per component, quotas")

    @model_validator(mode="before")
    @classmethod
    def _preset_under_the_sections(cls, data: Any) -> Any:
        """The preset's settings go under the file's own; an unknown preset is left to `_known_preset`."""
        if isinstance(data, dict) and data.get("algorithm") is not None:
            try:
                return expand(data)
            except RegistryError:
                return data
        return data

    _known_preset = field_validator("algorithm")(lambda cls, v: v if v is None else checked_entry(presets, v))

    @field_validator("watchers")
    @classmethod
    def _watchers_build(cls, entries: list[WatcherEntry]) -> list[WatcherEntry]:
        return checked_watchers(entries)  # unknown names and arguments fail here, naming watchers.N

    @model_validator(mode="after")
    def _shadows_build(self) -> "RunConfig":
        names = [s.name for s in self.shadows]
        if len(set(names)) != len(names):
            raise ValueError(f"shadows: names must differ, got {names}")
        for index, shadow in enumerate(self.shadows):
            try:
                trainer = self.shadow_trainer(shadow.name)
            except ValidationError as e:
                raise ValueError(validation_message(f"shadows.{index}.trainer", e, TrainerConfig)) from None
            transport = transport_of(trainer.weights.transport)
            if "rendezvous" in (*transport.needs, *transport.may_carry):
                raise ValueError(f"shadows.{index}.trainer.weights.transport: {trainer.weights.transport} meets the "
                                 "rollout workers at a rendezvous; a shadow's weights go to its evaluator alone: "
                                 "use kafka or files")
        return self

    def shadow_trainer(self, name: str) -> TrainerConfig:
        """The trainer section of the shadow `name`: the run's, with the shadow's overrides."""
        shadow = next((s for s in self.shadows if s.name == name), None)
        if shadow is None:
            raise ValueError(f"--shadow {name}: the config's shadows are {[s.name for s in self.shadows]}")
        return TrainerConfig.model_validate(deep_merge(self.trainer.model_dump(), shadow.trainer))

    @model_validator(mode="after")
    def _workers_have_partitions(self) -> "RunConfig":
        """A warning, not an error: a worker without a partition is idle, not wrong (it takes over when
        another leaves)."""
        for message in idle_workers(self.topics, {"tasks": ("rollout.workers", self.rollout.workers),
                                                  "experiences.raw": ("run.processor_workers", self.run.processor_workers)}):
            warnings.warn(message, IdleWorkers, stacklevel=2)
        return self

    @model_validator(mode="after")
    def _sections_agree(self, info: ValidationInfo) -> "RunConfig":
        """The rules between sections (infra/run/rules.py): each names both fields and why."""
        found = problems(self, whole_run=not (info.context or {}).get("component"))
        if found:
            raise ValueError("; ".join(found))
        return self


def load_run_config(path: str | Path) -> tuple[RunConfig, dict[str, Any]]:
    """The validated config and its raw mapping (stages are merged from the raw one)."""
    raw = load_yaml(path)
    config = _validated(path, raw)
    for index, stage in enumerate(config.run.stages):
        try:
            stage_config(raw, stage)
        except ValidationError as e:
            raise ConfigError(validation_message(f"{path}: run.stages.{index} ({stage.name})", e, RunConfig)) from None
    return config, raw


def load_component_config(path: str | Path) -> RunConfig:
    """What a component command (`undertow train`, `rollout`, …) reads: the same model and rules as
    `undertow run`, but for those about how a run wires its stages (config_rules.WHOLE_RUN)."""
    return _validated(path, load_yaml(path), component=True)


def _validated(path: str | Path, raw: dict[str, Any], **context: Any) -> RunConfig:
    try:
        return RunConfig.model_validate(raw, context=context)
    except ValidationError as e:
        raise ConfigError(validation_message(str(path), e, RunConfig)) from None


def stage_config(raw: dict[str, Any], stage: RunStage | None) -> RunConfig:
    """One stage's effective config: the run's sections with the stage's overrides, validated."""
    return RunConfig.model_validate(stage_mapping(raw, stage))


def stage_mapping(raw: dict[str, Any], stage: RunStage | None) -> dict[str, Any]:
    """The run's raw config with one stage's overrides merged into its sections."""
    merged = copy.deepcopy(raw)
    if stage is None:
        return merged
    for section in SECTIONS:
        merged[section] = deep_merge(merged.get(section) or {}, getattr(stage, section))
    if stage.algorithm is not None:
        merged["algorithm"] = stage.algorithm
    if stage.shadows is not None:
        merged["shadows"] = [s.model_dump() for s in stage.shadows]
    merged["namespace"] = f"{merged.get('namespace', 'undertow')}-{stage.name}"
    return merged


def write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path
