"""`undertow topics create|list|describe`: the topic catalog under a namespace."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from undertow.infra.cli.common import BootstrapOpt, ConfigOpt, NamespaceOpt, cluster, console, user_errors
from undertow.streams import Topics, create_topics, describe_topics, list_topics

topics_app = typer.Typer(help="Create and inspect undertow's topics.", no_args_is_help=True)


@topics_app.command("create")
def create(config: Optional[Path] = ConfigOpt, bootstrap: Optional[str] = BootstrapOpt,
           namespace: Optional[str] = NamespaceOpt,
           replication: Optional[int] = typer.Option(None, help="Replication factor (default: min(3, brokers)).")) -> None:
    """Create every catalog topic of the namespace that does not exist yet."""
    with user_errors():
        kafka, ns = cluster(config, bootstrap, namespace)
        made = create_topics(kafka, ns, replication)
        console.print(f"created {len(made)} topic(s)" + "".join(f"\n  {t}" for t in made))


@topics_app.command("list")
def list_(config: Optional[Path] = ConfigOpt, bootstrap: Optional[str] = BootstrapOpt,
          namespace: Optional[str] = NamespaceOpt) -> None:
    """The catalog of the namespace: each topic, its key, partitions, retention, and whether it exists."""
    with user_errors():
        kafka, ns = cluster(config, bootstrap, namespace)
        existing = set(list_topics(kafka))
        table = Table(title=f"topics of namespace '{ns}' at {kafka.bootstrap_servers}")
        table.add_column("topic", no_wrap=True)
        for col in ("key", "parts", "kept", "exists"):
            table.add_column(col, no_wrap=True)
        for name, spec in Topics(ns).specs().items():
            retention = "forever" if spec.retention_ms < 0 else f"{spec.retention_ms / 86_400_000:g} d"
            if spec.cleanup_policy == "compact":
                retention = "compacted"
            table.add_row(name, spec.key, str(spec.partitions), retention,
                          "[green]yes[/green]" if name in existing else "[red]no[/red]")
        console.print(table)
        others = sorted(t for t in existing if t.startswith(f"{ns}.") and t not in Topics(ns).specs())
        if others:
            console.print("other topics in the namespace: " + ", ".join(others))


@topics_app.command("describe")
def describe(names: Optional[List[str]] = typer.Argument(None, help="Topics (default: the namespace's)."),
             config: Optional[Path] = ConfigOpt, bootstrap: Optional[str] = BootstrapOpt,
             namespace: Optional[str] = NamespaceOpt) -> None:
    """Partitions, replication, record counts and configs of topics."""
    with user_errors():
        kafka, ns = cluster(config, bootstrap, namespace)
        names = names or list_topics(kafka, ns)
        table = Table(title=f"{len(names)} topic(s)")
        table.add_column("topic", no_wrap=True)
        for col in ("parts", "replicas", "records"):
            table.add_column(col, no_wrap=True)
        table.add_column("configs", overflow="fold", ratio=1)
        for info in describe_topics(kafka, names):
            configs = "\n".join(f"{k}={v}" for k, v in sorted(info.configs.items()))
            table.add_row(info.name, str(info.partitions), str(info.replication_factor), str(info.records), configs)
        console.print(table)
