"""Training reproduced from the log: restore the checkpoint of step A, train steps A+1..B again on
exactly the records the ledger says each of them used (read back from the topics), and compare the
weights with the run's own checkpoint of step B.

With the run's trainer settings the weights come out bit-identical on CPU: every step sees the same
records in the same order, the same optimizer and scheduler state, and the same arithmetic. What
breaks that: another number of torch threads (a reduction sums in another order), another ZeRO
stage or number of ranks (gradients are averaged in another order), another precision, or a step
the run trained on records it later refused as non-finite (the ledger leaves them out). With a
changed setting (another lr, another loss) the same data gives a counterfactual run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from undertow.kernel.models import ModelSpec, build_tokenizer
from undertow.streams import KafkaSettings, Topics
from undertow.streams.consumer import read_to_end
from undertow.schemas import DecodeError, decode

from .checkpoint import UNFINISHED, Ledger, restore, verify_checkpoint
from .config import EngineConfig, TrainerConfig
from .engine import export_pretrained
from .groups import record_id
from .objectives.chord import as_expert
from .runner import build_parts
from .step import StepShape, train_step


@dataclass
class Retrained:
    """What a retrain found: the two weights hashes and each step's loss."""

    start: int
    end: int
    weights_sha256: str
    checkpoint_sha256: str
    losses: list[float]

    @property
    def identical(self) -> bool:
        return self.weights_sha256 == self.checkpoint_sha256


def tag(step: int) -> str:
    return f"step-{step:08d}"


def weights_sha256(hf_dir: Path) -> str:
    """One hash over an HF export's tensors, by name (file layout and metadata aside)."""
    import torch
    from safetensors import safe_open

    tensors = {}
    for path in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(str(path), "pt") as f:
            tensors.update({name: f.get_tensor(name) for name in f.keys()})
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(name.encode())
        digest.update(str(tensor.dtype).encode())
        digest.update(tensor.view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def steps_to_retrain(root: Path, start: int, end: int) -> dict[int, list[str]]:
    """The ledger's record ids for steps start+1..end, each step exactly once: the ids it trained first,
    then those it reused (replay), in the order the step had them."""
    if end <= start:
        raise ValueError(f"--to ({end}) must be after --from ({start})")
    for step in (start, end):
        if not (root / tag(step)).is_dir():
            kept = sorted(p.name for p in root.glob("step-*") if p.is_dir())
            raise ValueError(f"no checkpoint of step {step} under {root} (kept: {kept or 'none'}; "
                             f"trainer.keep_checkpoints decides how many stay)")
    ledger = {e["step"]: e["ids"] + e.get("reused", []) for e in Ledger(root).entries() if start < e["step"] <= end}
    missing = [s for s in range(start + 1, end + 1) if s not in ledger]
    if missing:
        raise ValueError(f"the ledger {root / 'ledger.jsonl'} has no entry for step(s) {missing[:5]}")
    return ledger


def records_by_id(kafka: KafkaSettings, topics: Topics, wanted: set[str], record_type: type) -> dict[str, Any]:
    """The wanted records from the ready topic and the expert topic (demonstrations, marked as such)."""
    found: dict[str, Any] = {}
    for topic, mark in ((topics.ready, None), (topics.expert, as_expert)):
        for value in read_to_end(kafka, topic):
            try:
                record = decode(value, expect=record_type)
            except DecodeError:
                continue
            key = record_id(record)
            if key in wanted and key not in found:
                found[key] = mark(record) if mark else record
    missing = wanted - found.keys()
    if missing:
        raise ValueError(f"{len(missing)} record(s) the ledger names are on neither {topics.ready} nor "
                         f"{topics.expert} (retention?): {sorted(missing)[:3]}")
    return found


def records_from_archive(root: str, namespace: str, wanted: set[str], record_type: type) -> dict[str, Any]:
    """The wanted records from the run's archive (its experiences.ready as Parquet): no broker needed."""
    from undertow.streams.history import VIEWS, History
    from undertow.streams.replay import Selection, select

    view = next(name for name, v in VIEWS.items()  # the ready topic's view of the objective's record kind
                if v.kind == record_type.kind and v.suffix == "experiences.ready")
    history = History.from_archive(root, [namespace])
    try:
        found = {}
        for record in select(history, Selection(view=view, namespace=namespace)):
            key = record_id(record)
            if key in wanted and key not in found:
                found[key] = record
    finally:
        history.close()
    missing = wanted - found.keys()
    if missing:
        raise ValueError(f"{len(missing)} record(s) the ledger names are not in the archive {root} "
                         f"({namespace}): {sorted(missing)[:3]}")
    return found


def retrain(cfg: TrainerConfig, spec: ModelSpec, root: Path, ledger: Mapping[int, list[str]],
            records: Mapping[str, Any], start: int, end: int, out: Path) -> Retrained:
    """Steps start+1..end again from `root`'s checkpoint of `start`; the result's weights go to `out/hf`."""
    for step in (start, end):  # one saved before checksums existed is taken as it is
        if (problem := verify_checkpoint(root / tag(step))) not in (None, UNFINISHED):
            raise ValueError(f"checkpoint {root / tag(step)} is damaged: {problem}")
    process, objective, engine, ref_model, critic = build_parts(cfg, spec)
    restore(engine, root, tag(start), critic.model if critic else None)
    _take_settings(engine, cfg.engine)
    shape = StepShape(cfg.micro_batch_tokens, cfg.mini_batches, cfg.ppo_epochs, cfg.batching.pad_to_multiple)
    pad_id = build_tokenizer(spec).pad_token_id
    losses = []
    for step in range(start + 1, end + 1):
        if hasattr(objective, "begin_step"):
            objective.begin_step(step - 1)
        result = train_step(engine, objective, [records[i] for i in ledger[step]], ref_model, process,
                            pad_id=pad_id, shape=shape, critic=critic)
        losses.append(result.metrics.get("loss", float("nan")))
    export_pretrained(engine, out / "hf")
    return Retrained(start, end, weights_sha256(out / "hf"), weights_sha256(root / tag(end) / "hf"), losses)


def _take_settings(engine: Any, cfg: EngineConfig) -> None:
    """The restored optimizer and schedule carry the run's lr, betas and weight decay: this config's
    apply instead (the same numbers when it is the run's own; a counterfactual's when changed). The
    schedule's shape is already this config's: LambdaLR keeps its lambdas out of its state."""
    scheduler = engine.lr_scheduler
    scheduler.base_lrs = [cfg.lr for _ in scheduler.base_lrs]
    for group, shape in zip(scheduler.optimizer.param_groups, scheduler.lr_lambdas):
        group.update(initial_lr=cfg.lr, lr=cfg.lr * shape(scheduler.last_epoch), betas=tuple(cfg.betas),
                     weight_decay=cfg.weight_decay)
