"""`undertow retrain CONFIG --from A --to B`: steps A+1..B trained again on the records the ledger
names, the weights compared with the run's checkpoint of step B (trainer/retrain.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from undertow.infra.cli.common import console, context_of, run_config, user_errors


def retrain(config: Path = typer.Argument(..., exists=True, dir_okay=False,
                                          help="The stage's run file (a run directory's stages/N-name.yaml); "
                                               "a copy with other trainer settings gives a counterfactual run."),
            start: int = typer.Option(..., "--from", min=0, help="The checkpoint to start from (its step)."),
            end: int = typer.Option(..., "--to", min=1, help="The last step to train again (a kept checkpoint)."),
            archive: Optional[str] = typer.Option(
                None, help="Read the records from this archive (the run's archive/) instead of the topics: "
                           "no broker needed."),
            out: Optional[Path] = typer.Option(None, help="Where the retrained weights go (default: "
                                                          "<checkpoints>/retrain-A-B/hf).")) -> None:
    """Train steps A+1..B again on exactly the records each used, and say whether the weights match."""
    from undertow.streams import RunContext
    from undertow.trainer.objectives import objectives
    from undertow.trainer.retrain import records_by_id, records_from_archive, retrain as run_retrain, steps_to_retrain

    with user_errors():
        cfg = run_config(config)
        trainer = cfg.trainer
        context = RunContext(namespace=cfg.namespace, kafka=cfg.kafka, model=cfg.model)
        root = Path(trainer.checkpoint_dir).expanduser() / context.topics.owner
        ledger = steps_to_retrain(root, start, end)
        wanted = {i for ids in ledger.values() for i in ids}
        record_type = objectives.get(trainer.algorithm.objective).record_type
        if archive is not None:
            records = records_from_archive(archive, cfg.namespace, wanted, record_type)
        else:
            records = records_by_id(context_of(cfg).kafka, context.topics, wanted, record_type)
        console.print(f"retrain: steps {start + 1}-{end} of {root}, {len(wanted)} records read back")
        result = run_retrain(trainer, context.model, root, ledger, records, start, end,
                             out or root / f"retrain-{start}-{end}")
        verdict = "identical to" if result.identical else "different from"
        console.print(f"weights after step {end}: {result.weights_sha256[:16]} ({verdict} the run's checkpoint, "
                      f"{result.checkpoint_sha256[:16]})", highlight=False)
