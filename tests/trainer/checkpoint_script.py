"""Run by test_checkpoint_damage.py: real DeepSpeed checkpoints, saved or loaded in one process.

First, into ROOT: two steps, each saved (offsets 8 and 16, a ledger line each), then a third whose
save meets a full disk: torch.save writes half its bytes and raises ENOSPC, as a device out of space
does. It prints a SAVED line and waits for one line on stdin (the test damages copies meanwhile) that
lists the directories to resume, each as the trainer resumes (load, then the ledger cut back to the
step). Each phase prints one JSON line: what happened. One process: DeepSpeed's start costs seconds.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import io
import json
import logging
from pathlib import Path

import torch

from undertow.kernel.models import weights_to_bytes
from undertow.trainer.checkpoint import Ledger, PartitionOffset, TrainerState, load_checkpoint, save_checkpoint
from undertow.trainer.config import AlgorithmConfig, EngineConfig
from undertow.trainer.engine import build_training_engine, setup_process
from undertow.trainer.objectives import objectives
from undertow.trainer.step import StepShape, train_step

from tests.trainer.helpers import SPEC, make_group


def weights_sha(engine) -> str:
    return hashlib.sha256(weights_to_bytes(engine.module)).hexdigest()


def full_disk_save(obj, f, *args, **kwargs) -> None:
    """torch.save on a device that fills up halfway through the file."""
    buffer = io.BytesIO()
    real_save(obj, buffer, *args, **kwargs)
    with open(f, "wb") as out:
        out.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    raise OSError(errno.ENOSPC, "No space left on device", str(f))


real_save = torch.save


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    process = setup_process()
    engine = build_training_engine(SPEC, EngineConfig(zero_stage=0, lr=0.01), process)
    save(engine, process, Path(args.root))
    load(engine, [Path(p) for p in json.loads(input())])


def save(engine, process, root: Path) -> None:
    out: dict = {}
    root.mkdir(parents=True)
    rl = objectives.get("rl")(AlgorithmConfig())
    records = [e for g in range(2) for e in make_group(f"g{g}")]
    for step in (1, 2):
        train_step(engine, rl, records, None, process, pad_id=0, shape=StepShape())
        state = TrainerState(step=step, offsets=[PartitionOffset(topic="ready", partition=0, offset=8 * step)],
                             trained_ids=[f"id-{i}" for i in range(8 * step)], published_version=step)
        if step == 2:  # what a save SIGKILLed half way leaves: the next save prunes it
            (root / "step-00000009.partial" / "hf").mkdir(parents=True)
        save_checkpoint(engine, root, state, leader=True, keep=3)
        Ledger(root).append(step, [f"id-{i}" for i in range(8 * (step - 1), 8 * step)])
        out[f"sha{step}"] = weights_sha(engine)
    train_step(engine, rl, records, None, process, pad_id=0, shape=StepShape())
    torch.save = full_disk_save
    try:
        save_checkpoint(engine, root, TrainerState(step=3), leader=True, keep=3)
    except Exception as e:
        out["full_disk"] = f"{type(e).__name__}: {e}"
    finally:
        torch.save = real_save
    print("SAVED " + json.dumps(out), flush=True)


def load(engine, roots: list[Path]) -> None:
    out: dict = {}
    for root in roots:
        try:
            state = load_checkpoint(engine, root)
        except RuntimeError as e:
            out[root.name] = {"error": str(e)}
            continue
        Ledger(root).rewind(state.step)  # what the trainer's Leader does with the state loaded
        out[root.name] = {"step": state.step, "offsets": state.offset_map()[("ready", 0)],
                          "trained_ids": len(state.trained_ids), "sha": weights_sha(engine),
                          "ledger": [e["step"] for e in Ledger(root).entries()]}
    print("LOADED " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
