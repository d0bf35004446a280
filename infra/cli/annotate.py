"""`undertow annotate export | import`: experiences out to Label Studio, its annotations back as human
rewards or preference pairs (streams/annotate.py), onto a namespace's topics or into a Parquet file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from undertow.infra.cli.common import BootstrapOpt, ConfigOpt, NamespaceOpt, cluster, console, user_errors
from undertow.infra.cli.history import RootOpt, _history

annotate_app = typer.Typer(help="People in the loop: experiences to Label Studio and its annotations back.",
                           no_args_is_help=True)
LiveOpt = typer.Option(False, "--live", help="Read the live topics of --namespace instead of the archive.")
ViewOpt = typer.Option("experiences", help="View the experiences are in: experiences (ready) or raw.")


def _quoted(ids: list[str]) -> str:
    return ", ".join("'" + i.replace("'", "''") + "'" for i in ids)


@annotate_app.command("export")
def export(out: Path = typer.Option(..., "--out", "-o", help="Label Studio tasks to write (.json); the labeling "
                                    "config goes beside it (<name>.label_config.xml)."),
           mode: str = typer.Option("rating", help="rating: one task per experience; pairwise: two responses "
                                    "to one prompt per task."),
           where: Optional[str] = typer.Option(None, help="SQL condition over the view's columns."),
           view: str = ViewOpt,
           limit: Optional[int] = typer.Option(None, min=1, help="At most this many experiences (archive order)."),
           max_rating: int = typer.Option(5, min=2, help="With rating: the top of the scale."),
           root: Optional[str] = RootOpt, config: Optional[Path] = ConfigOpt, namespace: Optional[str] = NamespaceOpt,
           live: bool = LiveOpt, bootstrap: Optional[str] = BootstrapOpt,
           ) -> None:
    """Write selected experiences as Label Studio tasks (import JSON) and the labeling config for them."""
    from undertow.streams.annotate import export_tasks, label_config
    from undertow.streams.replay import Selection, select

    with user_errors():
        if mode not in ("rating", "pairwise"):
            raise ValueError(f"--mode: expected rating or pairwise, got {mode!r}")
        if out.suffix != ".json":
            raise ValueError(f"--out: expected a .json file, got {out.name!r}")
        history = _history(root, config, namespace, live, bootstrap, None)
        records = select(history, Selection(view=view, where=where, namespace=None if live else namespace))[:limit]
        if not records:
            raise ValueError("no experiences selected: nothing to annotate")
        tasks = export_tasks(records, mode, max_rating)  # type: ignore[arg-type]
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(tasks, indent=1, ensure_ascii=False))
        xml = out.with_name(out.stem + ".label_config.xml")
        xml.write_text(label_config(mode, max_rating))  # type: ignore[arg-type]
    console.print(f"wrote {len(tasks)} {mode} tasks from {len(records)} experiences to {out} "
                  f"(labeling config: {xml})", soft_wrap=True)


@annotate_app.command("import")
def import_(file: Path = typer.Argument(..., exists=True, dir_okay=False, help="Label Studio's JSON export."),
            to: Optional[str] = typer.Option(None, "--to", help="Namespace to send to: rewarded experiences to its "
                                             "--into topic, preference pairs to its experiences.ready."),
            into: str = typer.Option("raw", help="raw (the processors recompute advantages from the human rewards) "
                                     "or ready, for rewarded experiences; pairs always go to ready."),
            out: Optional[Path] = typer.Option(None, "--out", "-o", help="Also (or only) write the records to a .parquet file."),
            view: str = ViewOpt,
            root: Optional[str] = RootOpt, config: Optional[Path] = ConfigOpt, namespace: Optional[str] = NamespaceOpt,
            live: bool = LiveOpt, bootstrap: Optional[str] = BootstrapOpt,
            ) -> None:
    """Turn Label Studio annotations into human-rewarded experiences or preference pairs."""
    with user_errors():
        if to is None and out is None:
            raise ValueError("say where the records go: --to NAMESPACE, --out FILE.parquet, or both")
        if into not in ("raw", "ready"):
            raise ValueError(f"--into: expected raw or ready, got {into!r}")
        if out is not None and out.suffix != ".parquet":
            raise ValueError(f"--out: expected a .parquet file, got {out.name!r}")
        imported = _imported(file, view, root, config, namespace, live, bootstrap)
        for line in imported.skipped[:20]:
            console.print(f"skipped {line}", highlight=False, markup=False)
        if not imported.records:
            raise ValueError(f"{file.name}: no annotated task made a record ({len(imported.skipped)} skipped)")
        if out is not None:
            _write(imported.records, out)
        if to is not None:
            _send(imported.records, to, into, config, bootstrap)
    kinds = sorted({r.kind for r in imported.records})
    console.print(f"imported {len(imported.records)} {'/'.join(kinds)} records ({len(imported.skipped)} tasks skipped)"
                  + (f" to {to}" if to else "") + (f", wrote {out}" if out else ""), soft_wrap=True)


def _imported(file: Path, view: str, root, config, namespace, live, bootstrap):
    from undertow.streams.annotate import import_verdicts, read_verdicts
    from undertow.streams.replay import Selection, select

    try:
        export = json.loads(file.read_text())
    except ValueError as e:
        raise ValueError(f"{file.name}: not JSON ({e})") from None
    if not isinstance(export, list):
        raise ValueError(f"{file.name}: expected Label Studio's JSON export, a list of tasks")
    verdicts, skipped = read_verdicts(export)
    ids = sorted({i for v in verdicts for i in v.ids})
    experiences = {}
    if ids:
        history = _history(root, config, namespace, live, bootstrap, None)
        selection = Selection(view=view, where=f"experience_id IN ({_quoted(ids)})", namespace=None if live else namespace)
        for record in select(history, selection):
            experiences.setdefault(record.experience_id, record)  # a redelivered copy: the first archived
    imported = import_verdicts(verdicts, experiences)
    imported.skipped[:0] = skipped
    return imported


def _write(records, out: Path) -> None:
    import pyarrow.parquet as pq

    from undertow.schemas import to_arrow

    if len({type(r) for r in records}) > 1:
        raise ValueError("--out: the export mixes ratings and pairwise picks; import one project at a time")
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(to_arrow(records), out)


def _send(records, to: str, into: str, config, bootstrap) -> None:
    from undertow.schemas import Experience
    from undertow.streams import RecordProducer, Topics, create_topics
    from undertow.streams.replay import send_acknowledged, unprocessed

    kafka, _ = cluster(config, bootstrap, None)
    topics = Topics(to)
    create_topics(kafka, to)
    experiences = [r for r in records if isinstance(r, Experience)]
    if into == "raw":
        experiences = unprocessed(experiences)
    routed = [(getattr(topics, into), r) for r in experiences] + \
             [(topics.ready, r) for r in records if not isinstance(r, Experience)]
    with RecordProducer(kafka) as producer:
        send_acknowledged(producer, routed)
