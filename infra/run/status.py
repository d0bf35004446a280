"""Where a run stands, live or finished: its stages from run.json, their metrics from metrics.jsonl,
the archive when it kept one, and each stage's namespace on its broker while that broker is up."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from undertow.infra.broker.local import LocalKafka
from undertow.infra.report.metrics_log import read_metrics
from undertow.infra.run.config import load_run_config, stage_mapping
from undertow.infra.report.namespace import NamespaceStatus, namespace_status
from undertow.streams import KafkaSettings, KafkaUnreachable

ARCHIVE_VIEWS = ("experiences", "rejected", "metrics")


@dataclass
class StageSummary:
    """One stage: what run.json says of it and what its metrics and archive hold."""

    name: str
    namespace: str
    status: str = "pending"  # pending (not reached yet) | running | done | interrupted | failed
    seconds: float = 0.0
    attempts: int = 0
    restarts: int = 0
    metric_events: int = 0
    trainer_version: int | None = None  # the newest version the trainer reported
    reward_mean: float | None = None  # the trainer's last batch
    archived: dict[str, int] = field(default_factory=dict)  # view -> rows


@dataclass
class RunStatus:
    run_dir: Path
    status: str
    stages: list[StageSummary]
    bootstrap: str | None  # the broker the live figures come from; None: not reachable
    live: dict[str, NamespaceStatus] = field(default_factory=dict)  # namespace -> its topics and groups


def run_status(run_dir: Path) -> RunStatus:
    """The run in `run_dir`, from its files; with its broker's live figures when that is up."""
    config, raw = load_run_config(run_dir / "config.yaml")
    state = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
    done = {s["name"]: s for s in state.get("stages", [])}
    stages = []
    for index, stage in enumerate(list(config.run.stages) or [None]):
        name = stage.name if stage else "main"
        summary = StageSummary(name, stage_mapping(raw, stage).get("namespace", "undertow"))
        if name in done:
            entry = done[name]
            summary.status, summary.seconds = entry["status"], entry.get("seconds", 0.0)
            summary.attempts, summary.restarts = entry.get("attempts", 1), sum(entry.get("restarts", {}).values())
        elif index == state.get("stage") and state.get("status") == "running":
            summary.status = "running"
        stages.append(summary)
    _add_metrics(stages, read_metrics(run_dir / "metrics.jsonl"))
    if (run_dir / "archive").is_dir():
        _add_archive(stages, str(run_dir / "archive"))
    status = RunStatus(run_dir, state.get("status", "not started"), stages, None)
    kafka = run_cluster(run_dir, config.kafka)
    if kafka is not None:
        try:
            status.live = {s.namespace: namespace_status(kafka, s.namespace) for s in stages}
            status.bootstrap = kafka.bootstrap_servers
        except KafkaUnreachable:
            status.live = {}
    return status


def run_cluster(run_dir: Path, configured: KafkaSettings) -> KafkaSettings | None:
    """The cluster of the run: the configured one, else its own broker while it runs; None when neither."""
    settings = configured.with_env()
    if settings.bootstrap_servers:
        return settings
    own = run_dir / "broker"  # `undertow run` keeps its private broker's data (and port) here
    if own.is_dir() and LocalKafka(own).running_nodes():
        return LocalKafka(own).settings().model_copy(update={"client_id": settings.client_id})
    return None


def find_running_run(base: Path) -> Path | None:
    """The newest run under `base` whose run.json says running and whose broker answers."""
    candidates = []
    for state_file in base.glob("*/run.json"):
        try:
            running = json.loads(state_file.read_text()).get("status") == "running"
        except (OSError, ValueError):
            continue
        run_dir = state_file.parent
        if running and (run_dir / "config.yaml").exists() and _broker_up(run_dir):
            candidates.append((state_file.stat().st_mtime, run_dir))
    return max(candidates)[1] if candidates else None


def _broker_up(run_dir: Path) -> bool:
    """A killed `undertow run` leaves 'running' in run.json; its own broker then is down too."""
    own = run_dir / "broker"
    return not own.is_dir() or bool(LocalKafka(own).running_nodes())


def _add_metrics(stages: list[StageSummary], rows: list[dict]) -> None:
    by_name = {s.name: s for s in stages}
    for row in rows:
        stage = by_name.get(row.get("stage", "main"))
        if stage is None:
            continue
        stage.metric_events += 1
        if row.get("component") == "trainer" and row.get("step") is not None:
            stage.trainer_version = max(stage.trainer_version or 0, int(row["step"]))
            if "reward_mean" in row:
                stage.reward_mean = row["reward_mean"]


def _add_archive(stages: list[StageSummary], root: str) -> None:
    from undertow.streams.history import History, archive_namespaces  # DuckDB: only for a run that archived

    held = set(archive_namespaces(root))
    for stage in stages:
        if stage.namespace not in held:
            continue
        history = History.from_archive(root, [stage.namespace])
        try:
            stage.archived = {v: int(history.query(f"SELECT count(*) AS n FROM {v}").column("n")[0].as_py())
                              for v in ARCHIVE_VIEWS}
        finally:
            history.close()
