"""The report page's series: metric rows grouped into panels, each point on both x-axes (seconds
since the run started, and policy version), with a smoothed copy of every long series."""

from __future__ import annotations

import bisect
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Callable

IGNORED = {"component", "step", "time", "stage", "version", "policy_version", "trainer_version", "worker", "event"}
# The trainer's feed counts what it refused since the last step; the processors count since start.
PER_STEP_COUNTS = {"rejected", "rejected_stale", "duplicates"}
PLAIN_BELOW = 20  # points: evaluations every 50 versions are read point by point, not smoothed away


@dataclass
class Curve:
    """One series of a panel, on both x-axes."""

    label: str  # stage/component:name
    times: list[float]
    versions: list[float]
    values: list[float]
    smoothed: list[float] | None = None  # None: too few points to smooth, drawn as markers
    right: bool = False  # on the panel's second y-axis (a quantity of another scale, such as the learning rate)


@dataclass
class Mark:
    """An event drawn on every panel at its time and version: a watcher's alert."""

    label: str
    detail: str
    time: float
    version: float


@dataclass
class Panel:
    key: str
    title: str
    y_title: str
    note: str = ""
    curves: list[Curve] = field(default_factory=list)
    right_title: str | None = None  # the second y-axis, when some curves are `right`
    stacked: bool = False  # shares of a whole: drawn as stacked areas of their smoothed values
    marks: list[Mark] = field(default_factory=list)


@dataclass(frozen=True)
class PanelSpec:
    key: str
    title: str
    y_title: str
    match: Callable[[str, str], bool]  # (component, metric name) -> on this panel
    smooth: bool = True  # False for counters: a smoothed count is no count
    right: Callable[[str], bool] | None = None  # metric name -> on the second y-axis, titled `right_title`
    right_title: str | None = None
    stacked: bool = False


def _named(pattern: str, component: str | None = None) -> Callable[[str, str], bool]:
    """Metrics matching `pattern` from `component`, a shadow's among them (`eval@gspo`: a curve of its own)."""
    rx = re.compile(pattern)
    return lambda comp, name: (component is None or comp.split("@")[0] == component) and bool(rx.search(name))


# First match wins; the staleness distribution is derived from staleness_<k> (below), not matched.
SPECS = [
    PanelSpec("reward", "reward (training batches and rollouts)", "mean reward", _named(r"^reward_mean$")),
    PanelSpec("heldout", "evaluation", "score", _named(r"greedy_accuracy|pass@|mean_reward$", "eval")),
    PanelSpec("curriculum", "pass rates by taskset (task-stats, as the feeder sees them)", "pass rate",
              _named(r"/pass_rate$", "feeder")),
    PanelSpec("throughput", "throughput", "per second", _named(r"per_s$")),
    PanelSpec("losses", "losses, KL and entropy", "value", _named(r"(^|_)loss$|^nll$|approx_kl|^entropy$", "trainer")),
    PanelSpec("ratios", "importance ratios and clipping", "value", _named(r"^ratio_|^clip_fraction", "trainer")),
    PanelSpec("optimizer", "learning rate and gradient norm", "gradient norm", _named(r"^lr$|^grad_norm$", "trainer"),
              right=lambda name: name == "lr", right_title="learning rate"),
    PanelSpec("rejections", "rejections by stage and reason (cumulative)", "records",
              lambda comp, name: name in PER_STEP_COUNTS or name.endswith(".dropped"), smooth=False),
    PanelSpec("wait", "trainer wait and step time", "seconds", _named(r"^wait_s$|^step_s$", "trainer")),
]
STALENESS = PanelSpec("staleness", "staleness distribution of training batches", "share of the batch",
                      _named(r"^staleness_\d+$", "trainer"), stacked=True)


def smooth(values: list[float], weight: float) -> list[float]:
    """TensorBoard's debiased exponential moving average: the start is not pulled towards 0."""
    out, last, norm = [], 0.0, 0.0
    for v in values:
        last = weight * last + (1 - weight) * v
        norm = weight * norm + (1 - weight)
        out.append(last / norm)
    return out


def smoothing_weight(points: int) -> float:
    """About 1/10 of a short series, at most a 50-point window: the trend shows, steps still do."""
    return min(0.98, 1 - 10 / points)


class VersionClock:
    """The trainer's policy version at any time of a stage: for events that carry none (processors)."""

    def __init__(self, rows: list[dict]):
        self.marks: dict[str | None, tuple[list[float], list[float]]] = {}
        by_stage: dict[str | None, list[tuple[float, float]]] = defaultdict(list)
        for r in rows:
            if r["component"] == "trainer" and isinstance(r.get("version"), (int, float)):
                by_stage[r.get("stage")].append((r["time"], float(r["version"])))
        for stage, marks in by_stage.items():
            marks.sort()
            self.marks[stage] = ([t for t, _ in marks], [v for _, v in marks])

    def at(self, stage: str | None, t: float) -> float:
        times, versions = self.marks.get(stage, ([], []))
        i = bisect.bisect_right(times, t)
        return versions[i - 1] if i else 0.0


def version_of(row: dict, clock: VersionClock) -> float:
    for key in ("version", "policy_version"):
        if isinstance(row.get(key), (int, float)):
            return float(row[key])
    return clock.at(row.get("stage"), row["time"])


def build_panels(rows: list[dict], extra: dict[str, list[Curve]] | None = None) -> list[Panel]:
    """Every page panel with its curves; `extra` replaces a panel's curves (the archive's rejections)."""
    t0 = min(r["time"] for r in rows)
    clock = VersionClock(rows)
    oldest: dict[str | None, int] = defaultdict(lambda: -1)  # per stage: the warm-up's batches are all fresh
    for r in rows:
        for k in r:
            if STALENESS.match(r["component"], k):
                oldest[r.get("stage")] = max(oldest[r.get("stage")], int(k[10:]))
    points: dict[tuple[str, str, str], list[tuple[float, float, float]]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: r["time"]):
        label = f"{row['stage']}/{row['component']}" if row.get("stage") else row["component"]
        label += f"@{row['worker']}" if row.get("worker") else ""  # each processor worker counts its own
        x = (row["time"] - t0, version_of(row, clock))
        for name, value in row.items():
            if name in IGNORED or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value) and not STALENESS.match(row["component"], name):
                points[(f"{label}:{name}", row["component"], name)].append((*x, float(value)))
        if row["component"] == "trainer":
            _add_staleness_shares(row, label, x, oldest[row.get("stage")], points)
    specs = [*SPECS[:2], STALENESS, *SPECS[2:]]
    marks = alert_marks(rows, t0, clock)
    panels = {s.key: Panel(s.key, s.title, s.y_title, right_title=s.right_title, stacked=s.stacked, marks=marks)
              for s in specs}
    for (label, component, name), pts in sorted(points.items()):
        spec = next((s for s in [STALENESS, *SPECS] if s.match(component, name)), None)
        if spec is None:
            continue
        values = [p[2] for p in pts]
        if spec.key == "rejections" and name in PER_STEP_COUNTS:
            values = _cumulative(values)
        c = curve(label, [p[0] for p in pts], [p[1] for p in pts], values, spec.smooth)
        c.right = bool(spec.right and spec.right(name))
        panels[spec.key].curves.append(c)
    for key, curves in (extra or {}).items():
        panels[key].curves = curves
    return [p for p in panels.values() if p.curves]


def alert_marks(rows: list[dict], t0: float, clock: VersionClock) -> list[Mark]:
    """Every watcher alert of the run (component `watcher`, labelled with its watcher and alert)."""
    return [Mark(f"{r['watcher']}: {r['alert']}", ", ".join(f"{k} {v:.4g}" for k, v in r.items()
                                                            if k not in IGNORED | {"alert"} and isinstance(v, float)),
                 r["time"] - t0, version_of(r, clock))
            for r in sorted(rows, key=lambda r: r["time"]) if r["component"] == "watcher" and "alert" in r]


def _add_staleness_shares(row: dict, label: str, x: tuple[float, float], oldest: int, points: dict) -> None:
    """staleness_<k> counts -> the share of the batch k versions old, 0 where the row has none of k."""
    counts = [row.get(f"staleness_{k}", 0.0) for k in range(oldest + 1)]
    for k, n in enumerate(counts if sum(counts) else []):
        points[(f"{label}:staleness {k}", "trainer", f"staleness_{k}")].append((*x, n / sum(counts)))


def _cumulative(values: list[float]) -> list[float]:
    out, total = [], 0.0
    for v in values:
        total += v
        out.append(total)
    return out


def curve(label: str, times: list[float], versions: list[float], values: list[float], smoothable: bool = True) -> Curve:
    """A curve, smoothed when it is long enough and not a counter."""
    smoothed = smooth(values, smoothing_weight(len(values))) if smoothable and len(values) >= PLAIN_BELOW else None
    return Curve(label, times, versions, values, smoothed)
