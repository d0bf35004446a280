"""Checkpoints: the DeepSpeed state, an HF export, and what the trainer needs to resume exactly.

Layout under the run's directory:
    step-00000012/            DeepSpeed checkpoint (tag), with hf/ (save_pretrained), trainer_state.json
                              and, with several ranks, ranks.json (each rank's weights sha256: they must agree);
                              with a critic, critic/ (its own DeepSpeed checkpoint: weights and optimizer)
    LATEST                    the tag of the newest complete checkpoint (written last, atomically)
    ledger.jsonl              per step: which record ids it trained on (an audit trail; cut back on resume)
A crash mid-save leaves LATEST at the previous complete checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .engine import export_pretrained, rank_fingerprints
from .groups import Partition

LATEST = "LATEST"
STATE = "trainer_state.json"
LEDGER = "ledger.jsonl"
RANKS = "ranks.json"
CRITIC = "critic"
log = logging.getLogger(__name__)


class PartitionOffset(BaseModel):
    topic: str
    partition: int
    offset: int


class TrainerState(BaseModel):
    """Everything beyond the weights and optimizer that a restart needs."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(0, description="optimizer steps taken = the policy version of the weights")
    offsets: list[PartitionOffset] = Field(default_factory=list, description="next offset to read per partition")
    trained_ids: list[str] = Field(default_factory=list, description="recently trained record ids, oldest first")
    published_version: int | None = Field(None, description="last version sent to the weights topic")

    def offset_map(self) -> dict[Partition, int]:
        return {(o.topic, o.partition): o.offset for o in self.offsets}


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_checkpoint(engine: Any, root: Path, state: TrainerState, *, leader: bool, keep: int,
                    critic: Any = None) -> str:
    """Every rank calls this; rank 0 writes the trainer state and moves LATEST last. A `critic` engine
    is saved inside the tag, so LATEST covers both."""
    import torch.distributed as dist

    tag = f"step-{state.step:08d}"
    engine.save_checkpoint(str(root), tag=tag, save_latest=False)
    if critic is not None:
        critic.save_checkpoint(str(root / tag), tag=CRITIC, save_latest=False)
    export_pretrained(engine, root / tag / "hf")
    fingerprints = rank_fingerprints(engine)
    if leader:
        if fingerprints is not None:
            _atomic_write(root / tag / RANKS, json.dumps(fingerprints))
            if len(set(fingerprints)) > 1:
                log.error("checkpoint %s: the ranks hold different weights: %s", tag, fingerprints)
        _atomic_write(root / tag / STATE, state.model_dump_json())
        _atomic_write(root / LATEST, tag)
        _prune(root, keep)
    dist.barrier()
    return tag


def load_checkpoint(engine: Any, root: Path, critic: Any = None) -> TrainerState | None:
    """Restore the newest complete checkpoint into `engine` (and its critic into `critic`); None when
    there is none. A checkpoint without a critic (a run that had none) leaves `critic` as built."""
    if not (root / LATEST).exists():
        return None
    tag = (root / LATEST).read_text().strip()
    loaded, _ = engine.load_checkpoint(str(root), tag=tag, load_optimizer_states=True,
                                       load_lr_scheduler_states=True)
    if loaded is None:
        raise RuntimeError(f"checkpoint {root / tag}: DeepSpeed could not load it")
    if critic is not None and (root / tag / CRITIC).is_dir():
        loaded, _ = critic.load_checkpoint(str(root / tag), tag=CRITIC, load_optimizer_states=True,
                                           load_lr_scheduler_states=True)
        if loaded is None:
            raise RuntimeError(f"checkpoint {root / tag / CRITIC}: DeepSpeed could not load the critic")
    elif critic is not None:
        log.warning("checkpoint %s has no critic: the critic starts from its initial weights", root / tag)
    return TrainerState.model_validate_json((root / tag / STATE).read_text())


def _prune(root: Path, keep: int) -> None:
    tags = sorted(p for p in root.glob("step-*") if p.is_dir())
    for old in tags[:-keep]:
        shutil.rmtree(old, ignore_errors=True)


class Ledger:
    """Append-only record of which ids each step trained on; resume cuts it back to the checkpoint."""

    def __init__(self, root: Path):
        self.path = root / LEDGER

    def rewind(self, step: int) -> None:
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        _atomic_write(self.path, "".join(line + "\n" for line in kept))

    def append(self, step: int, ids: list[str]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps({"step": step, "ids": ids}) + "\n")

    def entries(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]
