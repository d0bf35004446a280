"""`undertow archive | query | replay`: the experience log kept as Parquet, queried with SQL, replayed."""

from __future__ import annotations

import datetime as dt
import signal
from pathlib import Path
from typing import Any, Optional

import typer
import yaml

from undertow.infra.cli.common import BootstrapOpt, ConfigOpt, NamespaceOpt, cluster, component, console, run_config, user_errors
from undertow.streams.archive import ArchiveConfig

DEFAULT_ROOT = ArchiveConfig.model_fields["root"].default
RootOpt = typer.Option(None, "--root", help=f"archive directory or URI (default: the config's archive.root, else {DEFAULT_ROOT}).")


def archive(config: Path = typer.Argument(..., exists=True, dir_okay=False, help="Run config (YAML)."),
            max_records: Optional[int] = typer.Option(None, help="Stop after archiving this many rows."),
            idle_timeout: Optional[float] = typer.Option(None, help="Stop after this many seconds without data."),
            ) -> None:
    """Archive the config's topics to Parquet until SIGTERM / Ctrl-C (or a budget); resumes where the files end."""
    from undertow.kernel.progress import progress
    from undertow.streams.archive import Archiver

    with user_errors():
        cfg, context = component(config)
        archiver = Archiver(cfg.archive, context)
    stop = {"requested": False}

    def handle(signum: int, _frame: Any) -> None:
        stop["requested"] = True

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)
    with user_errors(), progress(f"archive {cfg.namespace}", total=max_records, unit="rows") as bar:
        stats = archiver.run(lambda: stop["requested"], max_records, idle_timeout, bar)  # a full disk: exit 2
    console.print(f"archived {stats.rows} rows in {stats.files} files ({stats.rows_per_s:.0f} rows/s; "
                  f"{stats.undecodable} undecodable kept as rejected rows) under {cfg.archive.root}/{cfg.namespace}")


def _root(root: Optional[str], config: Optional[Path]) -> str:
    return root or run_config(config).archive.root


def _history(root: Optional[str], config: Optional[Path], namespace: Optional[str], live: bool,
             bootstrap: Optional[str], last: Optional[int]):
    from undertow.streams.history import History

    if live:
        kafka, ns = cluster(config, bootstrap, namespace)
        return History.from_topics(kafka, ns, last)
    return History.from_archive(_root(root, config), [namespace] if namespace else None)


def query(sql: str = typer.Argument(..., help="SQL over the views experiences, pairs, raw, rejected, metrics, task_stats, tasks."),
          root: Optional[str] = RootOpt, config: Optional[Path] = ConfigOpt, namespace: Optional[str] = NamespaceOpt,
          live: bool = typer.Option(False, "--live", help="Query the live topics instead of the archive."),
          last: Optional[int] = typer.Option(None, help="With --live: only the last N messages of each partition."),
          bootstrap: Optional[str] = BootstrapOpt,
          out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the result to a .csv or .parquet file."),
          limit: int = typer.Option(50, help="Rows shown in the terminal table."),
          ) -> None:
    """Run SQL over the archive (or live topics); print a table, or write CSV / Parquet."""
    with user_errors():
        if out is not None and out.suffix not in (".csv", ".parquet"):
            raise ValueError(f"--out: expected a .csv or .parquet file, got {out.name!r}")
        history = _history(root, config, namespace, live, bootstrap, last)
        table = history.query(sql)
        if out is not None:
            write_result(table, out)
            console.print(f"wrote {table.num_rows} rows to {out}")
        else:
            print_table(table, limit)


def write_result(table, out: Path) -> None:
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix == ".csv":
        pacsv.write_csv(table, out)
    else:
        pq.write_table(table, out)


def print_table(table, limit: int) -> None:
    from rich.table import Table

    view = Table(*table.column_names, caption=f"{table.num_rows} rows" + (f", first {limit} shown" if table.num_rows > limit else ""))
    for row in table.slice(0, limit).to_pylist():
        view.add_row(*(_cell(v) for v in row.values()))
    console.print(view)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _moment(text: Optional[str], option: str) -> Optional[dt.datetime]:
    if text is None:
        return None
    try:
        return dt.datetime.fromtimestamp(float(text), dt.timezone.utc)
    except ValueError:
        pass
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{option}: expected unix seconds or an ISO time (2026-01-31T12:00), got {text!r}") from None


def replay(to: str = typer.Option(..., "--to", help="Namespace to send to: its experiences.ready (or raw with --into raw)."),
           into: str = typer.Option("ready", help="ready (for the trainer) or raw (to re-run processors)."),
           shape: str = typer.Option("as_is", help="as_is | sft_best | dpo_pairs | unprocessed | a dotted path; "
                                     "arguments as YAML: '{name: sft_best, min_reward: 1}'."),
           view: str = typer.Option("experiences", help="View to select from: experiences (ready) or raw."),
           partition: Optional[int] = typer.Option(None, help="Only this partition."),
           first_offset: Optional[int] = typer.Option(None, help="First offset (inclusive)."),
           last_offset: Optional[int] = typer.Option(None, help="Last offset (inclusive)."),
           since: Optional[str] = typer.Option(None, help="Kafka time from (unix seconds or ISO, inclusive)."),
           until: Optional[str] = typer.Option(None, help="Kafka time until (exclusive)."),
           where: Optional[str] = typer.Option(None, help="SQL condition over the view's columns."),
           root: Optional[str] = RootOpt, config: Optional[Path] = ConfigOpt, namespace: Optional[str] = NamespaceOpt,
           live: bool = typer.Option(False, "--live", help="Select from the live topics of --namespace instead of the archive."),
           bootstrap: Optional[str] = BootstrapOpt,
           ) -> None:
    """Send selected historic experiences to a namespace's ready (or raw) topic; prints how many."""
    from undertow.kernel.progress import progress
    from undertow.streams import RecordProducer, Topics, create_topics
    from undertow.streams.replay import Selection, replay as run_replay

    with user_errors():
        if into not in ("ready", "raw"):
            raise ValueError(f"--into: expected ready or raw, got {into!r}")
        selection = Selection(view=view, partition=partition, first_offset=first_offset, last_offset=last_offset,
                              since=_moment(since, "--since"), until=_moment(until, "--until"), where=where,
                              namespace=None if live else namespace)
        entry = yaml.safe_load(shape) if shape.startswith("{") else shape
        kafka, _ = cluster(config, bootstrap, None)
        history = _history(root, config, namespace, live, bootstrap, None)
        topic = getattr(Topics(to), into)
        create_topics(kafka, to)
        with RecordProducer(kafka) as producer, progress(f"replay to {topic}", unit="records") as bar:
            result = run_replay(history, selection, entry, producer, topic, bar)
        console.print(f"replayed {result.sent} records ({result.selected} selected) to {topic} "
                      f"in {result.seconds:.2f} s ({result.records_per_s:.0f} records/s)")
