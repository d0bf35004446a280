"""Options and error handling shared by the command groups."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import typer
from rich.console import Console

from infra.config import ConfigError, load_cluster_config, resolve_kafka
from streams import KafkaSettings

console = Console()
err_console = Console(stderr=True)

ConfigOpt = typer.Option(None, "--config", "-c", help="YAML config (its `namespace` and `kafka` sections).",
                         exists=True, dir_okay=False)
BootstrapOpt = typer.Option(None, "--bootstrap", "-b", help="host:port[,…] of an external cluster.",
                            envvar="UNDERTOW_BOOTSTRAP")
NamespaceOpt = typer.Option(None, "--namespace", "-n", help="Topic namespace (default: config's, else 'undertow').")


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn expected failures into one red line and exit code 2, not a traceback."""
    try:
        yield
    except typer.Exit:  # click's Exit is a RuntimeError: let it through untouched
        raise
    except (ConfigError, ValueError, TimeoutError, RuntimeError) as e:
        err_console.print(f"[red]error:[/red] {e}", highlight=False)
        raise typer.Exit(2) from None


def cluster(config: Optional[Path], bootstrap: Optional[str], namespace: Optional[str]) -> tuple[KafkaSettings, str]:
    """The cluster settings and namespace a command should use."""
    cfg = load_cluster_config(config)
    kafka = cfg.kafka
    if bootstrap:
        kafka = kafka.model_copy(update={"bootstrap_servers": KafkaSettings(bootstrap_servers=bootstrap).bootstrap_servers})
    return resolve_kafka(kafka), namespace or cfg.namespace
