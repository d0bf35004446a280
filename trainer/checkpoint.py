"""Checkpoints: the DeepSpeed state, an HF export, and what the trainer needs to resume exactly.

Layout under the run's directory:
    step-00000012/            DeepSpeed checkpoint (tag), with hf/ (save_pretrained), trainer_state.json
                              and, with several ranks, ranks.json (each rank's weights sha256: they must agree);
                              with a critic, critic/ (its own DeepSpeed checkpoint: weights and optimizer)
                              and checksums.json (every file's size and sha256, written last)
    LATEST                    the tag of the newest complete checkpoint (written last, atomically)
    ledger.jsonl              per step: which record ids it trained on for the first time (`ids`) and which
                              it trained again, replayed on purpose (`reused`); an audit trail, cut back on resume
    damaged-step-00000014/    a checkpoint a resume found damaged, set aside for inspection

A checkpoint is written as `step-00000012.partial/` and renamed into place once its checksums are
on disk, so a crash (or a full disk) mid-save leaves LATEST at the previous complete checkpoint and
no directory a resume would take. A resume verifies the checkpoint LATEST names against its
checksums (and that DeepSpeed and the trainer state load); a damaged one (a truncated file, a
corrupt trainer_state.json, LATEST naming a missing directory) is logged and the next older sound
checkpoint is used, with its own offsets and trained ids: the ledger is cut back to it, so a step
lost this way is trained again exactly as after a crash, never twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from undertow.kernel.disk import remove, stop_when_full

from .engine import export_pretrained, rank_fingerprints
from .groups import Partition
from .replay import ReplaySaved

LATEST = "LATEST"
STATE = "trainer_state.json"
LEDGER = "ledger.jsonl"
RANKS = "ranks.json"
CRITIC = "critic"
CHECKSUMS = "checksums.json"
DAMAGED = "damaged-"
TAG = re.compile(r"^step-\d{8}$")
UNFINISHED = "no checksums.json (its save never finished)"
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
    replay: list[ReplaySaved] = Field(default_factory=list, description="the replay buffer's groups: their "
                                      "records' offsets on the ready topic and use counts (read back on resume)")

    def offset_map(self) -> dict[Partition, int]:
        return {(o.topic, o.partition): o.offset for o in self.offsets}


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text)
    except OSError:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def save_checkpoint(engine: Any, root: Path, state: TrainerState, *, leader: bool, keep: int,
                    critic: Any = None) -> str:
    """Every rank calls this; rank 0 writes the trainer state and the checksums, renames the
    checkpoint into place and moves LATEST last. A `critic` engine is saved inside the tag, so LATEST
    covers both. A full disk removes the partial checkpoint and raises DiskFull (LATEST unchanged)."""
    import torch.distributed as dist

    tag = f"step-{state.step:08d}"
    partial = root / f"{tag}.partial"
    if leader and partial.exists():  # a save that died here before
        shutil.rmtree(partial)
    dist.barrier()
    with stop_when_full(f"checkpoint {tag}", str(root), cleanup=remove(partial)):
        engine.save_checkpoint(str(root), tag=partial.name, save_latest=False)
        if critic is not None:
            critic.save_checkpoint(str(partial), tag=CRITIC, save_latest=False)
        export_pretrained(engine, partial / "hf")
        fingerprints = rank_fingerprints(engine)
        dist.barrier()  # every rank's shards are on disk before the checksums cover them
        if leader:
            if fingerprints is not None:
                _atomic_write(partial / RANKS, json.dumps(fingerprints))
                if len(set(fingerprints)) > 1:
                    log.error("checkpoint %s: the ranks hold different weights: %s", tag, fingerprints)
            _atomic_write(partial / STATE, state.model_dump_json())
            write_checksums(partial)
            _move_into_place(partial, root / tag)
            _atomic_write(root / LATEST, tag)
            _prune(root, keep)
    dist.barrier()
    return tag


def _move_into_place(partial: Path, final: Path) -> None:
    """Rename the finished checkpoint to its tag; the same step saved again replaces the older save
    (a crash in between leaves LATEST naming a missing directory: the resume takes the one before)."""
    if final.exists():
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(partial, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(partial, final)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_checksums(directory: Path) -> None:
    """checksums.json: the size and sha256 of every file of the checkpoint (the last file written)."""
    files = {str(p.relative_to(directory)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(directory.rglob("*")) if p.is_file() and p.name != CHECKSUMS}
    _atomic_write(directory / CHECKSUMS, json.dumps({"files": files}, indent=0))


def verify_checkpoint(directory: Path) -> str | None:
    """None when every file checksums.json lists is there with its size and sha256; else what is wrong."""
    if not directory.is_dir():
        return "the directory does not exist"
    if not (directory / CHECKSUMS).is_file():
        return UNFINISHED
    try:
        listed = json.loads((directory / CHECKSUMS).read_text())["files"]
        expected = {str(name): (int(f["bytes"]), str(f["sha256"])) for name, f in listed.items()}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return f"{CHECKSUMS} is unreadable ({type(e).__name__})"
    for name, (size, sha) in expected.items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} were written (truncated?)"
        if _sha256(path) != sha:
            return f"{name} does not match its sha256 (corrupt)"
    return None


def load_checkpoint(engine: Any, root: Path, critic: Any = None, *, leader: bool = True) -> TrainerState | None:
    """Restore the newest sound checkpoint into `engine` (and its critic into `critic`); None when
    there is none. LATEST's checkpoint comes first; a damaged one is logged and the next older sound
    one is loaded instead (the leader sets the damaged aside as `damaged-<tag>` and points LATEST at
    the one loaded). Raises when checkpoints exist and none is sound: starting afresh would train
    everything again. A checkpoint without a critic (a run that had none) leaves `critic` as built."""
    if not (root / LATEST).exists():
        return None
    named = (root / LATEST).read_text().strip()
    older = sorted((p.name for p in root.iterdir() if p.is_dir() and TAG.match(p.name) and p.name != named),
                   reverse=True)
    damaged: list[tuple[str, str]] = []
    for tag in [named, *older]:
        reason = verify_checkpoint(root / tag)
        if reason == UNFINISHED and tag == named and TAG.match(tag):  # written before checksums existed
            log.warning("checkpoint %s has no %s: loading it unverified", root / tag, CHECKSUMS)
            reason = None
        state = None
        if reason is None:
            try:
                state = restore(engine, root, tag, critic)
            except Exception as e:  # torch.load of a damaged file, a trainer state that does not validate
                reason = f"it does not load ({type(e).__name__}: {str(e)[:300]})"
        if state is not None:
            if damaged and leader:
                _set_aside(root, damaged, tag)
            return state
        log.error("checkpoint %s (LATEST: %s) is damaged: %s; falling back to the one before", root / tag, named,
                  reason)
        damaged.append((tag, reason or ""))
    raise RuntimeError(f"no sound checkpoint under {root}: " + "; ".join(f"{t}: {r}" for t, r in damaged)
                       + " (move the directory away to start afresh)")


def restore(engine: Any, root: Path, tag: str, critic: Any) -> TrainerState:
    """The checkpoint `tag` into `engine` (and `critic`), as it is: verifying it is the caller's."""
    state = TrainerState.model_validate_json((root / tag / STATE).read_text())
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
    return state


def _set_aside(root: Path, damaged: list[tuple[str, str]], loaded: str) -> None:
    """Damaged checkpoints out of the way (kept for inspection, never loaded or counted by pruning),
    LATEST at the one loaded."""
    for tag, reason in damaged:
        if (root / tag).is_dir():
            target = root / f"{DAMAGED}{tag}"
            shutil.rmtree(target, ignore_errors=True)
            os.replace(root / tag, target)
            (target / "DAMAGED.txt").write_text(reason + "\n")
    _atomic_write(root / LATEST, loaded)
    log.warning("resumed from checkpoint %s instead of %s", loaded, damaged[0][0])


def _prune(root: Path, keep: int) -> None:
    """The `keep` newest checkpoints stay; older ones go, with what crashed saves left (.partial, .old)."""
    tags = sorted(p for p in root.iterdir() if p.is_dir() and TAG.match(p.name))
    leftovers = [p for p in root.glob("step-*") if p.is_dir() and p.suffix in (".partial", ".old")]
    for old in tags[:-keep] + leftovers:
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

    def append(self, step: int, ids: list[str], reused: list[str] = ()) -> None:
        """The step's records: `ids` trained for the first time, `reused` replayed (trained before)."""
        entry = {"step": step, "ids": ids, **({"reused": list(reused)} if reused else {})}
        with self.path.open("a") as f:
            f.write(json.dumps(entry) + "\n")

    def entries(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line]
