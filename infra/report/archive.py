"""What the report page takes from a run's Parquet archive: sample experiences, rejected records
with their reasons, and the rejections over time (exact, where the metrics only count them)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from undertow.infra.report.series import Curve, VersionClock, curve
from undertow.infra.run.config import load_run_config, stage_mapping

SAMPLES = 24  # experiences in the table, spread evenly over the run
REJECTED_SHOWN = 30


@dataclass
class ArchiveTables:
    """The archive's part of the page: rows of plain values, ready for a table."""

    root: Path
    samples: list[dict]
    rejected_by_reason: list[dict]
    rejected: list[dict]
    rejection_curves: list[Curve]


def archive_root(run_dir: Path) -> Path | None:
    """Where `undertow run` archived this run (run.archive; archive.root may move it), if it did."""
    root = run_dir / "archive"
    if (run_dir / "config.yaml").exists():
        _, raw = load_run_config(run_dir / "config.yaml")
        root = Path((raw.get("archive") or {}).get("root") or root).expanduser()
    return root if root.is_dir() and any(p.is_dir() for p in root.iterdir()) else None


def read_archive(run_dir: Path, t0: float, clock: VersionClock) -> ArchiveTables | None:
    """The tables and rejection curves of the run's archive; None when it kept none."""
    from undertow.streams.history import History

    root = archive_root(run_dir)
    if root is None:
        return None
    history = History.from_archive(str(root))
    stage_of = _stages_by_namespace(run_dir)
    try:
        samples = history.query(
            "SELECT namespace, policy_version AS version, prompt_text AS prompt, response_text AS response, reward, "
            "list_avg(advantages) AS advantage, finish_reason FROM ("
            "  SELECT *, row_number() OVER (ORDER BY kafka_timestamp, kafka_partition, kafka_offset) AS i,"
            "         count(*) OVER () AS n FROM experiences)"
            f" WHERE (i - 1) % greatest(1, n // {SAMPLES}) = 0 ORDER BY i LIMIT {SAMPLES}").to_pylist()  # from the 1st
        by_reason = history.query("SELECT namespace, stage, reason, count(*) AS records, any_value(detail) AS example "
                                  "FROM rejected GROUP BY ALL ORDER BY records DESC").to_pylist()
        rejected = history.query("SELECT namespace, stage, reason, detail, record_id, topic, \"offset\" FROM rejected "
                                 f"ORDER BY time LIMIT {REJECTED_SHOWN}").to_pylist()
        times = history.query("SELECT namespace, stage, reason, time FROM rejected ORDER BY time").to_pylist()
    finally:
        history.close()
    return ArchiveTables(root, samples, by_reason, rejected, _rejection_curves(times, t0, clock, stage_of))


def _rejection_curves(rows: list[dict], t0: float, clock: VersionClock, stage_of: dict[str, str]) -> list[Curve]:
    """One cumulative count per (run stage, rejecting stage, reason), at the time of each rejection."""
    grouped: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        grouped.setdefault((r["namespace"], r["stage"], r["reason"]), []).append(r["time"])
    curves = []
    for (namespace, stage, reason), times in sorted(grouped.items()):
        run_stage = stage_of.get(namespace, namespace)
        curves.append(curve(f"{run_stage}/{stage}:{reason}", [t - t0 for t in times],
                            [clock.at(run_stage, t) for t in times], [float(i + 1) for i in range(len(times))],
                            smoothable=False))
    return curves


def _stages_by_namespace(run_dir: Path) -> dict[str, str]:
    if not (run_dir / "config.yaml").exists():
        return {}
    config, raw = load_run_config(run_dir / "config.yaml")
    stages = list(config.run.stages) or [None]
    return {stage_mapping(raw, s).get("namespace", "undertow"): s.name if s else "main" for s in stages}
