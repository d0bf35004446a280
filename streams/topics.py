"""The topic catalog of DESIGN.md: every topic undertow uses, under one namespace."""

from __future__ import annotations

from dataclasses import dataclass, field

from pydantic import BaseModel, ConfigDict, Field, field_validator

DAY_MS = 24 * 3600 * 1000
FOREVER = -1  # experiences are the durable log: kept until an operator decides otherwise
MAX_MESSAGE_BYTES = 20 << 20  # matches the local broker's message.max.bytes; weights chunk below it


@dataclass(frozen=True)
class TopicSpec:
    """One topic of the catalog: its role, key, partitions and retention."""

    suffix: str
    key: str
    about: str
    partitions: int
    retention_ms: int
    cleanup_policy: str = "delete"
    configs: dict[str, str] = field(default_factory=dict)

    def name(self, namespace: str) -> str:
        return f"{namespace}.{self.suffix}"

    def topic_configs(self, replication_factor: int) -> dict[str, str]:
        """Kafka topic configs; with replicas, acks=all waits for at least two of them."""
        cfg = {"retention.ms": str(self.retention_ms), "cleanup.policy": self.cleanup_policy,
               "max.message.bytes": str(MAX_MESSAGE_BYTES), **self.configs}
        if replication_factor >= 3:
            cfg["min.insync.replicas"] = "2"
        return cfg


CATALOG: tuple[TopicSpec, ...] = (
    TopicSpec("tasks", "task id", "feeder → rollout workers (one consumer group; workers pull)", 4, 7 * DAY_MS),
    TopicSpec("experiences.raw", "group id", "rollout → processors; a prompt group shares a partition", 4, FOREVER),
    TopicSpec("experiences.ready", "group id", "processors → trainer; retained for replay", 4, FOREVER),
    TopicSpec("experiences.rejected", "experience id", "every dropped record, with stage and reason", 1, FOREVER),
    TopicSpec("experiences.expert", "experience id",
              "undertow load --to expert → trainer: demonstrations mixed into RL steps (trainer.mixing)", 1, FOREVER),
    # One partition keeps a version's records in order. Compacted: announcements are keyed by model,
    # inline chunks by model and index, so what stays is the newest version (a late worker reads little).
    TopicSpec("weights", "model name (inline chunks: model#index)",
              "trainer → rollout workers: each version announced, its bytes inline or by transport", 1, FOREVER,
              "compact", configs={"segment.ms": str(3600 * 1000), "min.compaction.lag.ms": str(60 * 1000)}),
    TopicSpec("task-stats", "task id", "processors → feeder: pass rates per task", 1, FOREVER, "compact"),
    TopicSpec("metrics", "component", "everyone → monitor, archive", 1, 30 * DAY_MS),
    TopicSpec("evals", "taskset", "eval → anyone: held-out results per policy version and taskset", 1, FOREVER),
)


# The topics a consumer group shares among its workers: their partition counts bound how many workers
# of each stage do work (a fifth worker on four partitions gets none). The others are read whole.
SCALED = ("tasks", "experiences.raw", "experiences.ready")
# One partition keeps a version's chunks (weights) and the run's order of events: these never grow.
SINGLE = ("weights",)


class TopicsConfig(BaseModel):
    """`topics:` — partition counts and replication of the namespace's topics (`undertow topics create`
    and `undertow run` create them so; on topics that exist with fewer partitions they add the rest)."""

    model_config = ConfigDict(extra="forbid")

    partitions: dict[str, int] = Field(default_factory=dict, description=(
        "partitions per topic, by catalog suffix (tasks, experiences.raw, …); the rest keep the catalog's "
        "count (4 for tasks and experiences.*, else 1). More partitions: more rollout / processor workers at work"))
    replication: int | None = Field(None, ge=1, description="replication factor of every topic (None: min(3, brokers))")

    @field_validator("partitions")
    @classmethod
    def _known_topics(cls, value: dict[str, int]) -> dict[str, int]:
        known = [s.suffix for s in CATALOG]
        for suffix, count in value.items():
            if suffix not in known:
                raise ValueError(f"{suffix!r} is no topic of the catalog (expected one of {known})")
            if count < 1:
                raise ValueError(f"{suffix}: expected at least 1 partition, got {count}")
            if suffix in SINGLE and count != 1:
                raise ValueError(f"{suffix}: keeps 1 partition (a version's chunks stay in order), got {count}")
        return value

    def count(self, suffix: str) -> int:
        """Partitions of the topic `suffix`: the configured count, else the catalog's."""
        return self.partitions.get(suffix, next(s.partitions for s in CATALOG if s.suffix == suffix))


class IdleWorkers(UserWarning):
    """More workers in a consumer group than its topic has partitions: the extra ones get none."""


def idle_workers(topics: TopicsConfig, workers: dict[str, tuple[str, int]]) -> list[str]:
    """A message for each stage with more workers than partitions; `workers` maps a topic suffix to the
    field that sets the workers reading it and their number, e.g. {"tasks": ("rollout.workers", 6)}."""
    out = []
    for suffix, (field_name, n) in workers.items():
        parts = topics.count(suffix)
        if n > parts:
            out.append(f"{field_name} ({n}) > partitions of {suffix} ({parts}): {n - parts} worker(s) would get "
                       f"no partition and sit idle; set topics.partitions.{suffix} to at least {n}")
    return out


NAMESPACE_PATTERN = r"^[A-Za-z0-9_-]+$"  # a namespace prefixes topic and consumer-group names


# A shadow trainer reads the run's stream but writes these of its own: its weights, what it refuses, and
# its evaluations (a second algorithm compared on the same experiences, never steering the rollout).
SHADOW_OWNS = ("weights", "experiences.rejected", "evals")


class Topics:
    """The catalog's topic names under a namespace: `Topics("demo").ready == "demo.experiences.ready"`.

    With `shadow="gspo"` the topics a shadow trainer writes move under `demo.shadow-gspo.`
    (`SHADOW_OWNS`); those it reads stay the run's."""

    def __init__(self, namespace: str, shadow: str | None = None):
        for name, value in (("namespace", namespace), ("shadow", shadow)):
            if value is not None and (not value or not all(c.isalnum() or c in "-_" for c in value)):
                raise ValueError(f"{name}: expected letters, digits, '-' or '_', got {value!r}")
        self.namespace, self.shadow = namespace, shadow

    tasks = property(lambda self: self._name("tasks"))
    raw = property(lambda self: self._name("experiences.raw"))
    ready = property(lambda self: self._name("experiences.ready"))
    rejected = property(lambda self: self._name("experiences.rejected"))
    expert = property(lambda self: self._name("experiences.expert"))
    weights = property(lambda self: self._name("weights"))
    task_stats = property(lambda self: self._name("task-stats"))
    metrics = property(lambda self: self._name("metrics"))
    evals = property(lambda self: self._name("evals"))

    @property
    def owner(self) -> str:
        """Whose outputs these are: the namespace, or `<namespace>.shadow-<name>` (checkpoints go there too)."""
        return self.namespace if self.shadow is None else f"{self.namespace}.shadow-{self.shadow}"

    def component(self, base: str) -> str:
        """A metric event's component: `trainer`, or `trainer@gspo` for a shadow's (apart on every chart)."""
        return base if self.shadow is None else f"{base}@{self.shadow}"

    def _name(self, suffix: str) -> str:
        return f"{self.owner if suffix in SHADOW_OWNS else self.namespace}.{suffix}"

    def specs_by_suffix(self) -> dict[str, str]:
        """Catalog suffix → full topic name."""
        return {spec.suffix: self._name(spec.suffix) for spec in CATALOG}

    def specs(self) -> dict[str, TopicSpec]:
        """Full topic name → spec, for every topic of the catalog."""
        return {self._name(spec.suffix): spec for spec in CATALOG}
