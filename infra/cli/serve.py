"""`undertow serve CONFIG`: the OpenAI-compatible endpoint on the rollout engine and current weights."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer

from undertow.infra.cli.common import BootstrapOpt, console, context_of, run_config, user_errors
from undertow.streams import create_topics


def serve(config: Path = typer.Argument(..., help="The run's YAML config (its rollout: engine and sampling).",
                                        exists=True, dir_okay=False),
          host: str = typer.Option("127.0.0.1", help="Address to listen on."),
          port: int = typer.Option(8000, min=1, max=65535, help="Port to listen on."),
          name: str = typer.Option("serve-0", help="Component name in the experiences' metadata and metrics."),
          bootstrap: Optional[str] = BootstrapOpt) -> None:
    """Serve /v1/chat/completions until SIGTERM; sessions are published as experiences when their reward
    comes. Beyond loopback it needs serve.api_keys (keys from a variable or a file). With no cluster
    configured, the local broker is started if it is not running; the namespace's topics are created."""
    from undertow.rollout.serve.app import serve as run_server
    from undertow.rollout.serve.endpoint import Endpoint
    from undertow.rollout.serve.keys import check_binding, load_keys

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with user_errors():
        cfg = run_config(config)
        keys = load_keys(cfg.serve.api_keys) if cfg.serve.api_keys else frozenset()
        check_binding(host, keys)  # before the engine loads or the broker is reached
        if not bootstrap and not cfg.kafka.with_env().bootstrap_servers:
            local_broker()
        context = context_of(cfg, bootstrap)
        # What the sessions publish needs its topics, as `undertow run` makes them (existing ones are kept).
        create_topics(context.kafka, context.namespace, cfg.topics.replication, cfg.topics.partitions)
        run_server(Endpoint.connect(cfg.rollout, context, name, cfg.serve), host=host, port=port, keys=keys)


def local_broker() -> None:
    """No cluster configured: the local broker `undertow broker up` starts, started if it is not
    running (it keeps running after serve stops, with the experiences for a trainer to read)."""
    from undertow.infra.broker.local import LocalKafka, free_port_block
    from undertow.infra.broker.resolve import default_broker_dir

    # A broker made here takes free ports (from 9092 up), kept in its data directory for later commands.
    local = LocalKafka(default_broker_dir(), port=free_port_block(2, start=9092))
    if not local.running_nodes():
        console.print(f"no cluster configured: starting the local broker (data {local.data_dir}; "
                      f"`undertow broker down` stops it)")
        local.start()
