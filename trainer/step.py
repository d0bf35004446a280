"""One optimizer step on this rank's shard of a batch."""

from __future__ import annotations

import time
from dataclasses import fields, is_dataclass
from typing import Any

import torch

from schemas import Record

from .engine import Process
from .intake import record_tokens
from .relay import shard


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a (nested) batch dataclass to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if is_dataclass(batch):
        return type(batch)(**{f.name: to_device(getattr(batch, f.name), device) for f in fields(batch)})
    return batch


def train_step(engine: Any, objective: Any, records: list[Record], ref_model: Any, process: Process, *,
               pad_id: int, pad_to_multiple: int) -> dict[str, float]:
    """Backpropagate this rank's shard and step; returns this rank's metrics plus tokens/s.

    A rank whose shard is empty still runs forward and backward (on a copy of the first record,
    weighted 0), because every rank must take part in the gradient all-reduce.
    """
    started = time.perf_counter()
    mine = shard(records, process.rank, process.world_size)
    weight = 1.0 if mine else 0.0
    batch = objective.collate(mine or records[:1], pad_id=pad_id, pad_to_multiple=pad_to_multiple)
    out = objective.loss(engine, to_device(batch, process.device), ref_model)
    engine.backward(out.loss * weight)
    engine.step()
    seconds = time.perf_counter() - started
    tokens = sum(record_tokens(r) for r in records)  # the whole batch, over all ranks
    return {**out.metrics, "step_s": seconds, "tokens": float(tokens),
            "tokens_per_s": tokens / seconds if seconds > 0 else 0.0}
