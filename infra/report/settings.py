"""What a run trained and how, one line per stage, for the report page's header: the model, the
algorithm, batch and staleness, the rollout engine, the weights transport, and how held out each
evaluation taskset was (the evaluator's measured contamination)."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from undertow.infra.run.config import load_run_config, stage_config
from undertow.processors import builtins as _builtins  # noqa: F401  (registers the built-in processors)
from undertow.kernel.registry import entry_name
from undertow.processors.api import PROCESSORS
from undertow.rollout.contamination import held_out_text
from undertow.trainer.objectives import objectives


def settings_lines(run_dir: Path, rows: list[dict]) -> list[str]:
    """One line per stage of the run in `run_dir` (its config.yaml), or one saying why there is none."""
    path = run_dir / "config.yaml"
    if not path.exists():
        return ["settings: the run directory has no config.yaml"]
    try:
        config, raw = load_run_config(path)
        stages = [(s.name, stage_config(raw, s)) for s in config.run.stages] or [("main", config)]
    except ValueError as e:  # a config of another undertow version: the page still shows the numbers
        return [f"settings: {path} does not load here ({str(e).splitlines()[0]})"]
    return [f"stage {name}: {describe(cfg)}{contamination(rows, name)}" for name, cfg in stages]


def describe(cfg: Any) -> str:
    algo, batching = cfg.trainer.algorithm, cfg.trainer.batching
    loss = algo.objective
    if objectives.get(algo.objective).importance_sampled:  # it trains through a policy loss
        loss += f" ({entry_name(algo.policy_loss)}, {entry_name(algo.aggregation)})"
    return (f"model {_model(cfg.model)}; {loss}, advantage {_advantage(cfg.processors.pipeline)}; "
            f"batch {batching.experiences or f'{batching.token_budget} tokens'}, max staleness "
            f"{batching.max_staleness}; engine {entry_name(cfg.rollout.engine)}; weights by {cfg.trainer.weights.transport}"
            + (f", LoRA rank {cfg.trainer.lora.rank}" if cfg.trainer.lora else ""))


def contamination(rows: list[dict], stage: str) -> str:
    """How held out each evaluation taskset of the stage was, from its first evaluation's metrics."""
    first = next((r for r in rows if r["component"] == "eval" and r.get("stage", "main") == stage), None)
    shares = {k.removesuffix("/contamination"): v for k, v in (first or {}).items() if k.endswith("/contamination")}
    return "".join(f"; eval {name}: {held_out_text(share)}" for name, share in sorted(shares.items()))


def _model(model: Any) -> str:
    return model.source + (f" {Path(model.path).name}" if model.path else "")


def _advantage(pipeline: list[Any]) -> str:
    """The advantage estimator of the first processor that takes one: as configured, else its default."""
    for entry in pipeline:
        component = PROCESSORS.resolve(entry)
        taken = inspect.signature(component.obj).parameters.get("advantage")
        if taken is not None:
            return entry_name(component.kwargs.get("advantage", taken.default))
    return "none (no processor computes one)"

