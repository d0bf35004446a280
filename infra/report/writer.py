"""`undertow report RUN_DIR`: PNG plots of a run's metrics, a markdown summary and one HTML page."""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from undertow.infra.report.metrics_log import read_metrics
from undertow.infra.report.archive import read_archive
from undertow.infra.report.page import write_page
from undertow.infra.report.series import VersionClock, build_panels
from undertow.infra.report.settings import settings_lines

# Which metric names go on which plot: matched by name, so a new metric of a stage shows up
# without touching this file.
PANELS: dict[str, re.Pattern] = {
    "evaluation": re.compile(r"greedy_accuracy|pass@"),
    "reward": re.compile(r"reward"),
    "staleness": re.compile(r"stale"),
    "throughput": re.compile(r"(per_s|_rate|throughput)$"),
    "loss": re.compile(r"(^|_)loss|kl|entropy|clip_fraction"),
}
IGNORED = {"component", "step", "time", "stage"}


@dataclass
class Series:
    component: str
    name: str
    times: list[float]
    values: list[float]
    versions: list[float | None]  # the policy version of each point, where its event says


def collect(rows: list[dict]) -> dict[str, list[Series]]:
    """Group metric rows into series per panel."""
    t0 = min((r["time"] for r in rows), default=0.0)
    points: dict[tuple[str, str], list[tuple[float, float, float | None]]] = defaultdict(list)
    for row in rows:
        for name, value in row.items():
            if name in IGNORED or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            series = f"{row['stage']}/{row['component']}" if "stage" in row else row["component"]
            points[(series, name)].append((row["time"] - t0, float(value), row.get("version", row.get("step"))))
    panels: dict[str, list[Series]] = defaultdict(list)
    for (component, name), pts in sorted(points.items()):
        for panel, pattern in PANELS.items():
            if pattern.search(name):
                pts.sort(key=lambda p: p[0])
                panels[panel].append(Series(component, name, [p[0] for p in pts], [p[1] for p in pts],
                                            [p[2] for p in pts]))
                break
    return panels


def write_report(run_dir: Path) -> Path:
    """Plots into <run>/report/, a summary in <run>/report/summary.md; returns the summary's path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(run_dir / "metrics.jsonl")
    if not rows:
        raise ValueError(f"{run_dir}: no metrics.jsonl rows to report on")
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    panels = collect(rows)
    lines = [f"# Run report: {run_dir.name}", "", f"{len(rows)} metric events, "
             f"{(max(r['time'] for r in rows) - min(r['time'] for r in rows)):.0f} s.", ""]
    for panel, series in panels.items():
        plot(plt, series, panel, out / f"{panel}.png")
        images = [f"![{panel}]({panel}.png)"]
        if panel == "evaluation":  # evaluations are per policy version: that axis too
            plot(plt, series, panel, out / "evaluation-by-version.png", by_version=True)
            images.append("![evaluation by version](evaluation-by-version.png)")
        lines += [f"## {panel}", "", *images, "",
                  "| series | points | first 10% (mean) | last 10% (mean) | min | max |",
                  "| --- | --- | --- | --- | --- | --- |"]
        lines += [f"| {s.component}:{s.name} | {len(s.values)} | {_mean(s.values[:_tenth(s)]):.4g} | "
                  f"{_mean(s.values[-_tenth(s):]):.4g} | {min(s.values):.4g} | {max(s.values):.4g} |" for s in series]
        lines.append("")
    summary = out / "summary.md"
    summary.write_text("\n".join(lines))
    write_html(run_dir, rows, out / "index.html")
    return summary


def write_html(run_dir: Path, rows: list[dict], path: Path) -> Path:
    """The report page: every panel, the archive's samples and rejections (or a note that there are none)."""
    t0 = min(r["time"] for r in rows)
    archive = read_archive(run_dir, t0, VersionClock(rows))
    exact = archive is not None and bool(archive.rejection_curves)
    panels = build_panels(rows, {"rejections": archive.rejection_curves} if exact else None)
    settings = settings_lines(run_dir, rows)
    for panel in panels:
        if panel.key == "rejections":
            panel.note = ("every rejected record of the archive" if exact else
                          "the counters of the metrics" + ("; the archive holds no rejected record" if archive else ""))
    for panel in panels:
        if panel.key == "heldout":
            panel.note = "; ".join(line.split("; eval ", 1)[1].replace("; eval ", ", ")
                                   for line in settings if "; eval " in line)
    header = [f"{len(rows)} metric events over {max(r['time'] for r in rows) - t0:.0f} s; {_stages(run_dir)}",
              *settings,
              "Bold lines are smoothed (a debiased exponential moving average, at most a 50-point window); "
              "the faint ones behind them are the raw values. Click a legend entry to hide a series."]
    return write_page(path, f"Run report: {run_dir.name}", header, panels, archive)


def _stages(run_dir: Path) -> str:
    state = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
    stages = ", ".join(f"{s['name']} {s['status']} in {s.get('seconds', 0):.0f} s" for s in state.get("stages", []))
    return f"run {state.get('status', 'of unknown status')}" + (f": {stages}" if stages else "")


def plot(plt, series: list[Series], title: str, path: Path, by_version: bool = False) -> None:
    fig, ax = plt.subplots(figsize=(8, 4))
    for s in series[:12]:
        xs = s.versions if by_version else s.times
        ax.plot(xs, s.values, label=f"{s.component}:{s.name}", linewidth=1, marker="." if by_version else None)
    ax.set_xlabel("policy version" if by_version else "seconds since start")
    ax.set_title(title)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _tenth(s: Series) -> int:
    return max(1, len(s.values) // 10)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)
