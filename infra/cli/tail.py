"""`undertow tail TOPIC`: print the records of a topic decoded, or follow it."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any, Optional

import typer

from undertow.infra.cli.common import BootstrapOpt, ConfigOpt, NamespaceOpt, cluster, user_errors
from undertow.infra.report.tail import Condition, tail as tail_topic, topic_name

TEXT_CHARS = 120  # of a prompt or response on one line; --json prints them whole


def tail(topic: str = typer.Argument(..., help="A topic: experiences.ready, experiences.rejected, metrics, … "
                                               "(in the namespace) or a full name."),
         lines: int = typer.Option(10, "--lines", "-l", help="Start this many records before each partition's end."),
         from_beginning: bool = typer.Option(False, "--from-beginning", help="Start at each partition's first record."),
         follow: bool = typer.Option(False, "--follow", "-f", help="Keep printing new records until Ctrl-C."),
         where: list[str] = typer.Option([], "--where", "-w", help="FIELD OP VALUE (OP: = != > < >= <=); repeatable, "
                                                                   "all must hold. E.g. 'reward>0.5', 'reason=stale'."),
         as_json: bool = typer.Option(False, "--json", help="One JSON object per record, texts whole."),
         config: Optional[Path] = ConfigOpt, bootstrap: Optional[str] = BootstrapOpt,
         namespace: Optional[str] = NamespaceOpt) -> None:
    """Records of any undertow topic, decoded: text, reward, advantage, version, reasons for rejected."""
    with user_errors():
        conditions = [Condition.parse(w) for w in where]
        kafka, ns = cluster(config, bootstrap, namespace)
        name = topic_name(topic, ns)
        stop = {"requested": False}

        def handle(signum: int, _frame: Any) -> None:
            stop["requested"] = True

        signal.signal(signal.SIGINT, handle)
        signal.signal(signal.SIGTERM, handle)
        for row in tail_topic(kafka, name, last=None if from_beginning else lines, follow=follow,
                              stop=lambda: stop["requested"]):
            if all(c.holds(row) for c in conditions):
                print(json.dumps(row, default=str) if as_json else one_line(row), flush=True)


def one_line(row: dict[str, Any]) -> str:
    where = f"{row['partition']}:{row['offset']}"
    fields = " ".join(f"{k}={_text(v)}" for k, v in row.items() if k not in ("partition", "offset", "kind")
                      and v not in (None, "", [], {}))
    return f"{where} {row['kind']} {fields}"


def _text(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str) if not isinstance(value, (int, float)) else repr(value)
    return text if len(text) <= TEXT_CHARS else text[:TEXT_CHARS - 1] + "…"
