"""`undertow status` and `undertow report`: look at a namespace or a finished run."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from infra.cli_common import BootstrapOpt, ConfigOpt, NamespaceOpt, cluster, console, user_errors
from infra.metrics_log import read_metrics
from infra.report import write_report
from infra.status import namespace_status


def status(run_dir: Optional[Path] = typer.Argument(None, help="A run directory: adds its throughput figures."),
           config: Optional[Path] = ConfigOpt, bootstrap: Optional[str] = BootstrapOpt,
           namespace: Optional[str] = NamespaceOpt) -> None:
    """Topics, consumer groups and their lag, the latest policy version, throughput."""
    with user_errors():
        if run_dir is not None and config is None and (run_dir / "config.yaml").exists():
            config = run_dir / "config.yaml"
        kafka, ns = cluster(config, bootstrap, namespace)
        st = namespace_status(kafka, ns)
        console.print(f"namespace [bold]{ns}[/bold] at {kafka.bootstrap_servers}; "
                      f"latest policy version: [bold]{st.policy_version if st.policy_version is not None else '-'}[/bold]")
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
        if run_dir is not None:
            _throughput(run_dir)


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
    """PNG plots of reward, staleness, throughput and losses, and a markdown summary."""
    with user_errors():
        summary = write_report(run_dir)
        console.print(f"wrote {summary} and {len(list(summary.parent.glob('*.png')))} plot(s)")
