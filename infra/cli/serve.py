"""`undertow serve CONFIG`: the OpenAI-compatible endpoint on the rollout engine and current weights."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import typer

from undertow.infra.cli.common import BootstrapOpt, component, user_errors


def serve(config: Path = typer.Argument(..., help="The run's YAML config (its rollout: engine and sampling).",
                                        exists=True, dir_okay=False),
          host: str = typer.Option("127.0.0.1", help="Address to listen on."),
          port: int = typer.Option(8000, min=1, max=65535, help="Port to listen on."),
          name: str = typer.Option("serve-0", help="Component name in the experiences' metadata and metrics."),
          bootstrap: Optional[str] = BootstrapOpt) -> None:
    """Serve /v1/chat/completions until SIGTERM; sessions are published as experiences when their reward comes."""
    from undertow.rollout.serve.app import serve as run_server
    from undertow.rollout.serve.endpoint import Endpoint

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with user_errors():
        cfg, context = component(config, bootstrap)
        run_server(Endpoint.connect(cfg.rollout, context, name, cfg.serve), host=host, port=port)
