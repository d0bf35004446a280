"""The topic catalog of DESIGN.md: every topic undertow uses, under one namespace."""

from __future__ import annotations

from dataclasses import dataclass, field

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
    # One partition keeps a version's records in order. Compacted: announcements are keyed by model,
    # inline chunks by model and index, so what stays is the newest version (a late worker reads little).
    TopicSpec("weights", "model name (inline chunks: model#index)",
              "trainer → rollout workers: each version announced, its bytes inline or by transport", 1, FOREVER,
              "compact", configs={"segment.ms": str(3600 * 1000), "min.compaction.lag.ms": str(60 * 1000)}),
    TopicSpec("task-stats", "task id", "processors → feeder: pass rates per task", 1, FOREVER, "compact"),
    TopicSpec("metrics", "component", "everyone → monitor, archive", 1, 30 * DAY_MS),
    TopicSpec("evals", "taskset", "eval → anyone: held-out results per policy version and taskset", 1, FOREVER),
)


NAMESPACE_PATTERN = r"^[A-Za-z0-9_-]+$"  # a namespace prefixes topic and consumer-group names


class Topics:
    """The catalog's topic names under a namespace: `Topics("demo").ready == "demo.experiences.ready"`."""

    def __init__(self, namespace: str):
        if not namespace or not all(c.isalnum() or c in "-_" for c in namespace):
            raise ValueError(f"namespace: expected letters, digits, '-' or '_', got {namespace!r}")
        self.namespace = namespace

    tasks = property(lambda self: self._name("tasks"))
    raw = property(lambda self: self._name("experiences.raw"))
    ready = property(lambda self: self._name("experiences.ready"))
    rejected = property(lambda self: self._name("experiences.rejected"))
    weights = property(lambda self: self._name("weights"))
    task_stats = property(lambda self: self._name("task-stats"))
    metrics = property(lambda self: self._name("metrics"))
    evals = property(lambda self: self._name("evals"))

    def _name(self, suffix: str) -> str:
        return f"{self.namespace}.{suffix}"

    def specs(self) -> dict[str, TopicSpec]:
        """Full topic name → spec, for every topic of the catalog."""
        return {spec.name(self.namespace): spec for spec in CATALOG}
