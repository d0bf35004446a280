"""Options and error handling shared by the command groups."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Optional

import typer
from rich.console import Console
from rich.markup import escape

from undertow.infra.broker.resolve import resolve_kafka
from undertow.kernel.config_io import ConfigError
from undertow.streams import KafkaSettings, RunContext

if TYPE_CHECKING:
    from undertow.infra.run.config import RunConfig

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
        err_console.print(f"[red]error:[/red] {escape(str(e))}", highlight=False)  # a message may hold [brackets]
        raise typer.Exit(2) from None


def run_config(config: Optional[Path]) -> "RunConfig":
    """The run config a command reads: the file validated as a component sees it; defaults when none."""
    from undertow.infra.run.config import RunConfig, load_component_config  # every section's model comes with it

    return RunConfig() if config is None else load_component_config(config)


def context_of(cfg: "RunConfig", bootstrap: Optional[str] = None, namespace: Optional[str] = None) -> RunContext:
    """What the command's components get: the namespace, the model and the cluster resolved once
    (--bootstrap, `kafka:`, $UNDERTOW_BOOTSTRAP, else the local broker with its TLS and login)."""
    kafka = cfg.kafka
    if bootstrap:
        kafka = kafka.model_copy(update={"bootstrap_servers": KafkaSettings(bootstrap_servers=bootstrap).bootstrap_servers})
    return RunContext(namespace=namespace or cfg.namespace, kafka=resolve_kafka(kafka), model=cfg.model)


def component(config: Optional[Path], bootstrap: Optional[str] = None,
              namespace: Optional[str] = None) -> tuple["RunConfig", RunContext]:
    """The run config and the context of a command that needs nothing checked in between."""
    cfg = run_config(config)
    return cfg, context_of(cfg, bootstrap, namespace)


def cluster(config: Optional[Path], bootstrap: Optional[str], namespace: Optional[str]) -> tuple[KafkaSettings, str]:
    """The resolved cluster settings and namespace a command should use."""
    _, context = component(config, bootstrap, namespace)
    return context.kafka, context.namespace
