"""`undertow config check|show FILE`: a run config validated, or shown as each stage will run it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
import yaml

from undertow.infra.cli.common import console, user_errors
from undertow.kernel.registry import entry_name

config_app = typer.Typer(help="Validate a run config, or show what each stage will run with.", no_args_is_help=True)

SECRETS = ("sasl_password", "ssl_password")
ConfigArg = typer.Argument(..., help="The run's YAML config.", exists=True, dir_okay=False)


@config_app.command("check")
def check(config: Path = ConfigArg) -> None:
    """Validate every section and the rules between them, each stage included; exit 2 naming the field."""
    with user_errors():
        stages = _effective_stages(config)
        console.print(f"ok  {config}: {summary(stages)}", highlight=False, soft_wrap=True, markup=False)


@config_app.command("show")
def show(config: Path = ConfigArg) -> None:
    """Print each stage's effective config as YAML: its overrides merged in, every default filled."""
    with user_errors():
        documents = [f"# stage {label}\n{yaml.safe_dump(shown(cfg), sort_keys=False)}"
                     for label, cfg in _effective_stages(config)]
        # print(), not rich: YAML must come out verbatim (rich would wrap it and read [..] as markup).
        print("---\n".join(documents), end="")


def _effective_stages(path: Path) -> list[tuple[str, Any]]:
    """(label, validated config) for each stage; one stage labelled 'main' when there are none."""
    from undertow.infra.run.config import load_run_config, stage_config  # every stage's config models come with it

    config, raw = load_run_config(path)
    if not config.run.stages:
        return [("main", config)]
    return [(f"{stage.name} ({stage.steps} steps)", stage_config(raw, stage)) for stage in config.run.stages]


def shown(config: Any) -> dict[str, Any]:
    """What a stage's processes read: every section but `run` (that is the supervisor's), with no secret."""
    data = config.model_dump(mode="json", exclude={"run"})
    for secret in SECRETS:
        if data["kafka"].get(secret):
            data["kafka"][secret] = "***"  # people paste this output into issues
    return data


def summary(stages: list[tuple[str, Any]]) -> str:
    """One line: each stage's namespace, trainer objective, processors pipeline, and how much of each
    evaluation taskset training can draw too."""
    return "; ".join(f"{label}: namespace {cfg.namespace}, {cfg.trainer.algorithm.objective}, "
                     f"pipeline [{', '.join(map(entry_name, cfg.processors.pipeline))}]{_contamination(cfg)}"
                     for label, cfg in stages)


def _contamination(cfg: Any) -> str:
    from undertow.rollout.contamination import shares

    found = [f"{t.name} {share:.0%} training prompts"
             for t, share in shares(cfg.eval.tasksets, cfg.eval.max_tasks, cfg.feeder.tasksets)]
    return f", eval [{', '.join(found)}]" if found else ""

