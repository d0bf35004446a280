"""`undertow watch CONFIG`: every watcher of the `watchers:` section until SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Optional

import typer

from undertow.infra.cli.common import BootstrapOpt, console, context_of, run_config, user_errors


def watch(config: Path = typer.Argument(..., exists=True, dir_okay=False, help="Run config (YAML) with a watchers section."),
          bootstrap: Optional[str] = BootstrapOpt) -> None:
    """Alert on stream statistics (the watchers section) into the metrics topic; resumes after each one's last commit."""
    from undertow.watchers.runner import run_watchers

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("kafka").setLevel(logging.WARNING)  # a consumer and producer per watcher: too chatty at INFO
    with user_errors():
        cfg = run_config(config)
        if not cfg.watchers:
            raise ValueError(f"{config}: watchers is empty; name at least one of the registered watchers")
        context = context_of(cfg, bootstrap)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stats = run_watchers(cfg.watchers, context, stop)
    for name, s in stats.items():
        console.print(f"watcher {name}: {s.records} records, {s.alerts} alerts, {s.errors} errors")
