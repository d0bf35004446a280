"""The `undertow` command line."""

from __future__ import annotations

import typer

from undertow.infra.cli.broker import broker_app
from undertow.infra.cli.config import config_app
from undertow.infra.cli.eval import eval_command
from undertow.infra.cli.history import archive, query, replay
from undertow.infra.cli.monitor import monitor
from undertow.infra.cli.processors import process
from undertow.infra.cli.rollout import rollout_cli
from undertow.infra.cli.run import run
from undertow.infra.cli.status import report, status
from undertow.infra.cli.tail import tail
from undertow.infra.cli.topics import topics_app
from undertow.infra.cli.trainer import train
from undertow.infra.cli.watch import watch

app = typer.Typer(
    name="undertow",
    help="Streaming reinforcement fine-tuning of language models on Kafka.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("run")(run)
app.command("status")(status)
app.command("report")(report)
app.add_typer(rollout_cli)  # undertow feed, undertow rollout
app.command("process")(process)
app.command("train")(train)
app.command("eval")(eval_command)
app.command("watch")(watch)
app.command("archive")(archive)
app.command("query")(query)
app.command("replay")(replay)
app.command("monitor")(monitor)
app.command("tail")(tail)
app.add_typer(broker_app, name="broker")
app.add_typer(topics_app, name="topics")
app.add_typer(config_app, name="config")


def main() -> None:
    app()

