"""The `undertow` command line."""

from __future__ import annotations

import typer

# Modules, not their functions: `undertow.infra.cli.run` must stay the module (a function of the
# same name bound here would hide it from `import undertow.infra.cli.run as ...` and from mock.patch).
from undertow.infra.cli import acls, algorithms, annotate, broker, config, history, load, monitor, prepare, processors
from undertow.infra.cli import retrain, rollout, run, serve, status, tail, topics, trainer, watch
from undertow.infra.cli import eval as evaluation

app = typer.Typer(
    name="undertow",
    help="Streaming reinforcement fine-tuning of language models on Kafka.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("run")(run.run)
app.command("status")(status.status)
app.command("report")(status.report)
app.add_typer(rollout.rollout_cli)  # undertow feed, undertow rollout
app.command("serve")(serve.serve)
app.command("process")(processors.process)
app.command("train")(trainer.train)
app.command("eval")(evaluation.eval_command)
app.command("watch")(watch.watch)
app.command("archive")(history.archive)
app.command("query")(history.query)
app.command("replay")(history.replay)
app.command("load")(load.load)
app.command("retrain")(retrain.retrain)
app.command("prepare")(prepare.prepare)
app.add_typer(annotate.annotate_app, name="annotate")
app.command("monitor")(monitor.monitor)
app.command("tail")(tail.tail)
app.add_typer(broker.broker_app, name="broker")
app.add_typer(topics.topics_app, name="topics")
app.add_typer(config.config_app, name="config")
app.command("algorithms")(algorithms.algorithms)
app.command("acls")(acls.acls)

def main() -> None:
    app()

