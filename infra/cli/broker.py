"""`undertow broker up|down|status`: the local Apache Kafka (KRaft) broker or 3-node cluster."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import List, Optional

import typer

from undertow.infra.broker import kafka_dist
from undertow.infra.broker.local import LocalKafka
from undertow.infra.cli.common import console, user_errors
from undertow.infra.broker.resolve import default_broker_dir
from undertow.streams import BOOTSTRAP_ENV

broker_app = typer.Typer(help="Run a local Apache Kafka broker (KRaft mode) for undertow.", no_args_is_help=True)

DataOpt = typer.Option(None, "--data", "-d", help="Data directory (default: $UNDERTOW_HOME/broker).")


@broker_app.command("up")
def up(data: Optional[Path] = DataOpt,
       port: int = typer.Option(9092, "--port", "-p", help="Client port of the first node (node i: port+2i)."),
       cluster: int = typer.Option(1, "--cluster", help="Nodes: 1, or 3 (replication 3, min.insync.replicas 2)."),
       heap: str = typer.Option("512m", help="JVM heap per node."),
       sasl_user: Optional[List[str]] = typer.Option(
           None, "--sasl-user", help="NAME:PASSWORD (repeatable): clients must log in with SASL/PLAIN."),
       tls: bool = typer.Option(False, "--tls", help="Clients connect over TLS, trusting <data>/tls/ca.pem."),
       acls: bool = typer.Option(False, "--acls", help="Authorize every request by its ACLs (`undertow acls CONFIG "
                                                       "--apply`); the first --sasl-user is a super user.")) -> None:
    """Start the broker (or resume it with its data); returns once it serves metadata."""
    with user_errors():
        if os.environ.get(BOOTSTRAP_ENV):
            console.print(f"{BOOTSTRAP_ENV}={os.environ[BOOTSTRAP_ENV]}: using that cluster, starting nothing.")
            return
        users = dict(_user(u) for u in sasl_user or [])
        local = LocalKafka(data or default_broker_dir(), port=port, nodes=cluster, heap=heap, sasl_users=users, tls=tls,
                           acls=acls)
        if len(local.state.nodes) != cluster:
            raise ValueError(f"--cluster: {local.data_dir} holds a {len(local.state.nodes)}-node cluster, not {cluster}")
        if users and users != local.state.sasl_users:
            raise ValueError(f"--sasl-user: {local.data_dir} was created with other users; use a new --data")
        if tls and not local.state.tls:
            raise ValueError(f"--tls: {local.data_dir} was created without TLS; use a new --data")
        if acls and not local.state.acls:
            raise ValueError(f"--acls: {local.data_dir} was created without ACLs; use a new --data")
        t0 = time.monotonic()
        local.start()
        console.print(f"Kafka {local.state.kafka_version} up in {time.monotonic() - t0:.1f}s: "
                      f"[bold]{local.bootstrap_servers}[/bold] {local.listener} "
                      f"({len(local.state.nodes)} node(s), data {local.data_dir})")


def _user(spec: str) -> tuple[str, str]:
    name, sep, password = spec.partition(":")
    if not sep:
        raise ValueError(f"--sasl-user: expected NAME:PASSWORD, got {spec!r}")
    return name, password


@broker_app.command("down")
def down(data: Optional[Path] = DataOpt) -> None:
    """Stop the broker cleanly; its data stays for the next `up`."""
    local = LocalKafka(data or default_broker_dir())
    if not local.running_nodes():
        console.print("no local broker running")
        return
    local.stop()
    console.print(f"stopped ({local.data_dir})")


@broker_app.command("status")
def status(data: Optional[Path] = DataOpt) -> None:
    """Nodes, ports and data directory of the local broker."""
    local = LocalKafka(data or default_broker_dir())
    running = set(local.running_nodes())
    if os.environ.get(BOOTSTRAP_ENV):
        console.print(f"{BOOTSTRAP_ENV}={os.environ[BOOTSTRAP_ENV]} (external cluster)")
    console.print(f"Kafka {kafka_dist.kafka_version()}, {local.listener} clients, data {local.data_dir}")
    for node in local.state.nodes:
        state = "[green]running[/green]" if node.node_id in running else "[red]stopped[/red]"
        console.print(f"  node {node.node_id}: 127.0.0.1:{node.port} {state}" + (f" pid {node.pid}" if node.pid else ""))
    raise typer.Exit(0 if running else 1)
