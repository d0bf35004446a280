"""`undertow status` and `undertow report`: look at a run (live or finished), a namespace, or a run's metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from undertow.infra.cli.common import BootstrapOpt, ConfigOpt, NamespaceOpt, cluster, console, user_errors
from undertow.infra.report.metrics_log import read_metrics
from undertow.infra.report.writer import write_report
from undertow.infra.run.config import RunSection
from undertow.infra.run.status import RunStatus, find_running_run, run_status
from undertow.infra.report.namespace import NamespaceStatus, namespace_status
from undertow.infra.report.scaling import lag_report, trainer_wait_fraction

RUNS_DIR = Path(RunSection.model_fields["dir"].default)


def status(run_dir: Optional[Path] = typer.Argument(None, help="A run directory (default: the running run under "
                                                               f"./{RUNS_DIR}, else the namespace's topics)."),
           config: Optional[Path] = ConfigOpt, bootstrap: Optional[str] = BootstrapOpt,
           namespace: Optional[str] = NamespaceOpt,
           as_json: bool = typer.Option(False, "--json", help="Print the autoscaling signal as JSON: lag per "
                                        "consumer group and per topic, the trainer's wait fraction.")) -> None:
    """A run's stages, metrics, archive and live topics; or one namespace's topics, groups and lag."""
    with user_errors():
        if run_dir is None and config is None and namespace is None:  # (-b is also $UNDERTOW_BOOTSTRAP)
            run_dir = find_running_run(RUNS_DIR)
        if run_dir is not None and config is None and namespace is None and (run_dir / "config.yaml").exists():
            st = run_status(run_dir)
            if as_json:
                typer.echo(json.dumps({"run": st.run_dir.name, "status": st.status, "bootstrap": st.bootstrap,
                                       "namespaces": {ns: lag_report(live) for ns, live in st.live.items()},
                                       **_wait(run_dir)}, indent=1))
                return
            show_run(st)
            _throughput(run_dir)
            return
        kafka, ns = cluster(config, bootstrap, namespace)
        if as_json:
            typer.echo(json.dumps({"namespace": ns, "bootstrap": kafka.bootstrap_servers,
                                   **lag_report(namespace_status(kafka, ns)), **_wait(run_dir)}, indent=1))
            return
        console.print(f"namespace [bold]{ns}[/bold] at {kafka.bootstrap_servers}")
        show_namespace(namespace_status(kafka, ns))
        if run_dir is not None:
            _throughput(run_dir)


def show_run(st: RunStatus) -> None:
    console.print(f"run [bold]{st.run_dir.name}[/bold]: {st.status}; broker: "
                  f"{st.bootstrap or 'not running (figures from the run directory)'}")
    table = Table(title="stages")
    for col in ("stage", "namespace", "status", "seconds", "attempts", "restarts", "metric events",
                "trainer version", "reward (last batch)"):
        table.add_column(col, justify="left" if col in ("stage", "namespace", "status") else "right")
    for s in st.stages:
        table.add_row(s.name, s.namespace, s.status, f"{s.seconds:.0f}", str(s.attempts), str(s.restarts),
                      str(s.metric_events), _or_dash(s.trainer_version),
                      "-" if s.reward_mean is None else f"{s.reward_mean:.3f}")
    console.print(table)
    if any(s.archived for s in st.stages):
        archive = Table(title=f"archive ({st.run_dir / 'archive'})")
        for col in ("stage", "experiences", "rejected", "metrics"):
            archive.add_column(col, justify="left" if col == "stage" else "right")
        for s in st.stages:
            if s.archived:
                archive.add_row(s.name, *(str(s.archived[v]) for v in ("experiences", "rejected", "metrics")))
        console.print(archive)
    for ns, live in st.live.items():
        console.print(f"namespace [bold]{ns}[/bold]")
        show_namespace(live)


def show_namespace(st: NamespaceStatus) -> None:
    console.print(f"latest policy version: [bold]{_or_dash(st.policy_version)}[/bold]")
    table = Table(title="topics")
    table.add_column("topic", no_wrap=True)
    table.add_column("records", justify="right")
    for topic, n in sorted(st.records.items()):
        table.add_row(topic, str(n))
    console.print(table)
    groups = Table(title="consumer groups")
    for col in ("group", "topic", "committed", "end", "lag"):
        groups.add_column(col, no_wrap=col in ("topic",))
    for g in st.groups:
        groups.add_row(g.group, g.topic, str(g.committed), str(g.end), str(g.lag))
    console.print(groups)


def _wait(run_dir: Optional[Path]) -> dict[str, Optional[float]]:
    """The trainer's recent wait fraction, from the run's metrics log (a namespace alone has none)."""
    if run_dir is None:
        return {}
    return {"trainer_wait_fraction": trainer_wait_fraction(read_metrics(run_dir / "metrics.jsonl"))}


def _or_dash(value: object) -> str:
    return "-" if value is None else str(value)


def _throughput(run_dir: Path) -> None:
    rows = read_metrics(run_dir / "metrics.jsonl")
    rates: dict[str, float] = {}
    for row in rows:
        for k, v in row.items():
            if isinstance(v, (int, float)) and k.endswith("per_s"):
                rates[f"{row['component']}:{k}"] = v
    for name, value in sorted(rates.items()):
        console.print(f"  {name} = {value:.1f}")


def report(run_dir: Path = typer.Argument(..., help="The run directory.", exists=True, file_okay=False)) -> None:
    """One HTML page (opens offline), PNG plots of reward, staleness, throughput and losses, a markdown summary."""
    with user_errors():
        summary = write_report(run_dir)
        console.print(f"wrote {summary.parent / 'index.html'}, {summary} and "
                      f"{len(list(summary.parent.glob('*.png')))} plot(s)")
