"""`undertow topics create|list|describe`: the topic catalog under a namespace."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from rich.table import Table

from undertow.infra.cli.common import BootstrapOpt, ConfigOpt, NamespaceOpt, cluster, component, console, user_errors
from undertow.streams import SCALED, Topics, TopicsConfig, create_topics, describe_topics, grow_topics, list_topics

topics_app = typer.Typer(help="Create and inspect undertow's topics.", no_args_is_help=True)


@topics_app.command("create")
def create(config: Optional[Path] = ConfigOpt, bootstrap: Optional[str] = BootstrapOpt,
           namespace: Optional[str] = NamespaceOpt,
           replication: Optional[int] = typer.Option(None, help="Replication factor (default: the config's "
                                                                "topics.replication, else min(3, brokers))."),
           partitions: Optional[int] = typer.Option(None, "--partitions", "-p", min=1, help=(
               "Partitions of tasks, experiences.raw and experiences.ready (default: the config's topics.partitions, "
               "else 4); topics that exist with fewer get more."))) -> None:
    """Create every catalog topic of the namespace that does not exist yet; add partitions to those that
    have fewer than asked."""
    with user_errors():
        cfg, context = component(config, bootstrap, namespace)
        kafka, ns = context.kafka, context.namespace
        wanted = {**cfg.topics.partitions, **({s: partitions for s in SCALED} if partitions else {})}
        TopicsConfig(partitions=wanted)  # a count the catalog refuses fails here, naming the topic
        made = create_topics(kafka, ns, replication or cfg.topics.replication, wanted)
        console.print(f"created {len(made)} topic(s)" + "".join(f"\n  {t}" for t in made))
        for g in grow_topics(kafka, ns, wanted):
            console.print(f"  {g.topic}: {g.before} -> {g.after} partitions")


@topics_app.command("list")
def list_(config: Optional[Path] = ConfigOpt, bootstrap: Optional[str] = BootstrapOpt,
          namespace: Optional[str] = NamespaceOpt) -> None:
    """The catalog of the namespace: each topic, its key, partitions, retention, and whether it exists."""
    with user_errors():
        cfg, context = component(config, bootstrap, namespace)
        kafka, ns = context.kafka, context.namespace
        existing = set(list_topics(kafka))
        table = Table(title=f"topics of namespace '{ns}' at {kafka.bootstrap_servers}")
        table.add_column("topic", no_wrap=True)
        for col in ("key", "parts", "kept", "exists"):
            table.add_column(col, no_wrap=True)
        for name, spec in Topics(ns).specs().items():
            retention = "forever" if spec.retention_ms < 0 else f"{spec.retention_ms / 86_400_000:g} d"
            if spec.cleanup_policy == "compact":
                retention = "compacted"
            table.add_row(name, spec.key, str(cfg.topics.count(spec.suffix)), retention,
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
