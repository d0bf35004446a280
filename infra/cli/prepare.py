"""`undertow prepare CONFIG`: data-juicer ops over a taskset before training (rollout/feeder/prepare.py);
writes the prepared taskset (Parquet) and a report of what each op dropped or changed (JSON, and printed)."""

from __future__ import annotations

from pathlib import Path

import typer

from undertow.infra.cli.common import console, user_errors


def prepare(config: Path = typer.Argument(..., exists=True, dir_okay=False,
                                          help="Prepare file (YAML): source, ops, text, out, report."),
            ) -> None:
    """Run data-juicer ops over a taskset; write the prepared taskset and a per-op report."""
    from rich.table import Table

    from undertow.rollout.feeder.prepare import load_prepare_config, prepare as run_prepare

    with user_errors():
        cfg = load_prepare_config(config)
        report = run_prepare(cfg)
    table = Table("op", "kind", "in", "out", "dropped", "changed", "s",
                  caption=f"{report.tasks_in} tasks -> {report.tasks_out} in {report.out}")
    for op in report.ops:
        table.add_row(op.op, op.kind, str(op.tasks_in), str(op.tasks_out), str(len(op.dropped)),
                      str(len(op.changed)), f"{op.seconds:.2f}")
    console.print(table)
    console.print(f"wrote {report.tasks_out} tasks to {report.out} and the report to {cfg.report_path()}", soft_wrap=True)
