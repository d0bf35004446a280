"""`undertow run CONFIG` / `undertow run --resume RUN_DIR`: the whole loop, with a live view."""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path
from typing import Optional

import typer
from rich.live import Live
from rich.table import Table

from undertow.infra.cli.common import console, user_errors
from undertow.infra.report.metrics_log import MetricsRecorder, read_metrics
from undertow.rollout.contamination import held_out_text

# (label, short label for a log line, component prefix, metric) shown in the live view.
LIVE_ROWS = [
    ("trainer step", "step", "trainer", "version"),
    ("loss", "loss", "trainer", "loss"),
    ("mean reward (trained)", "reward", "trainer", "reward_mean"),
    ("mean reward (rollout)", "rollout reward", "rollout", "reward_mean"),
    ("staleness (mean)", "staleness", "trainer", "staleness_mean"),
    ("policy version (rollout)", "rollout version", "rollout", "policy_version"),
    ("train tokens/s", "train tok/s", "trainer", "tokens_per_s"),
    ("rollout tokens/s", "rollout tok/s", "rollout", "tokens_per_s"),
    ("trainer wait s / step", "wait s", "trainer", "wait_s"),
]

def run(config: Optional[Path] = typer.Argument(None, exists=True, dir_okay=False, help="Run config (YAML)."),
        resume: Optional[Path] = typer.Option(None, exists=True, file_okay=False,
                                              help="Continue an interrupted or failed run from its directory."),
        runs_dir: Optional[Path] = typer.Option(None, "--runs-dir", help="Parent of the run directory (default: run.dir)."),
        steps: Optional[int] = typer.Option(None, min=1, help="Trainer steps of a single-stage run (overrides run.steps)."),
        live: Optional[bool] = typer.Option(None, help="Live view (default: run.live when on a terminal).")) -> None:
    """Run feeder, rollout workers, processors and trainer against one broker until the steps are done."""
    # Imported here: every stage's config comes with them, and each stage process starts this CLI.
    from undertow.infra.run.runner import Run, install_stop_handler, new_run_dir
    from undertow.infra.run.config import load_run_config

    with user_errors():
        if (config is None) == (resume is None):
            raise ValueError("give either CONFIG or --resume RUN_DIR")
        run_dir = resume if resume else None
        cfg, raw = load_run_config(config or resume / "config.yaml")
        if steps is not None:
            raw.setdefault("run", {})["steps"] = steps
            cfg = cfg.model_copy(update={"run": cfg.run.model_copy(update={"steps": steps})})
        if run_dir is None:
            run_dir = new_run_dir(cfg, raw, runs_dir)
        show = cfg.run.live if live is None else live
        show = show and console.is_terminal
        console.print(f"run directory: [bold]{run_dir}[/bold]", soft_wrap=True)
        with Live(console=console, refresh_per_second=2, transient=False) if show else nullcontext() as screen:
            runner = Run(cfg, raw, run_dir, view=_live_view(screen) if show else _log_view(cfg.run.log_every_s))
            install_stop_handler(runner)
            outcomes = runner.execute()
        for o in outcomes:
            colour = "green" if o.status == "done" else "red"
            console.print(f"stage [bold]{o.name}[/bold]: [{colour}]{o.status}[/{colour}] in {o.seconds:.0f}s"
                          + (f"\n{o.message}" if o.message else ""))
        _summary(run_dir)
        if runner.state.status in ("interrupted", "failed"):
            console.print(f"resume with: undertow run --resume {run_dir}", soft_wrap=True, highlight=False)
        if runner.state.status != "done":
            raise typer.Exit(1 if runner.state.status == "failed" else 130)


def _table(stage: str, recorder: MetricsRecorder) -> Table:
    table = Table(title=f"undertow — stage {stage}", show_header=False)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for label, _, component, name in LIVE_ROWS:
        value = recorder.value(component, name)
        table.add_row(label, "-" if value is None else f"{value:.4g}")
    return table


def _live_view(screen: Live):
    def view(run: object, stage: str, recorder: MetricsRecorder) -> None:
        screen.update(_table(stage, recorder))
    return view


def _log_view(every_s: float):
    """For a log file: one line every `every_s` seconds, so a log grows with the run's length only."""
    last = [0.0]

    def view(run: object, stage: str, recorder: MetricsRecorder) -> None:
        if time.time() - last[0] < every_s:
            return
        last[0] = time.time()
        parts = [f"{short} {v:.4g}" for _, short, c, n in LIVE_ROWS if (v := recorder.value(c, n)) is not None]
        console.print(f"[{stage}] " + (" · ".join(parts) or "starting…"), highlight=False, markup=False, soft_wrap=True)
    return view


def _summary(run_dir: Path) -> None:
    """Reward at the start and end of each stage, and evaluation scores at its first and last
    evaluation, each with the share of its prompts training draws too (held out only at 0)."""
    metrics = read_metrics(run_dir / "metrics.jsonl")
    rows = [r for r in metrics if r.get("component") == "trainer" and "reward_mean" in r]
    for stage in dict.fromkeys(r.get("stage", "main") for r in rows):
        values = [r["reward_mean"] for r in rows if r.get("stage", "main") == stage]
        k = max(1, len(values) // 10)
        console.print(f"stage {stage}: {len(values)} steps, mean reward {sum(values[:k]) / k:.3f} (first {k}) → "
                      f"{sum(values[-k:]) / k:.3f} (last {k})", soft_wrap=True)
    evals = [r for r in metrics if r.get("component") == "eval"]
    for stage in dict.fromkeys(r.get("stage", "main") for r in evals):
        ours = [r for r in evals if r.get("stage", "main") == stage]
        first, last = ours[0], ours[-1]
        for name in sorted(k for k in first if k.endswith("/greedy_accuracy") or "/pass@" in k):
            console.print(f"stage {stage}: eval {name} {first[name]:.3f} (v{first.get('version', 0):.0f}) → "
                          f"{last.get(name, float('nan')):.3f} (v{last.get('version', 0):.0f}), "
                          f"{held_out_text(first.get(name.split('/')[0] + '/contamination'))}", soft_wrap=True)

