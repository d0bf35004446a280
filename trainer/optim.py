"""The optimizer side of a step: AdamW (torch's, or DeepSpeed's CPU Adam) guarded against non-finite
gradients, and the learning-rate schedule."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from .config import EngineConfig
from .relay import collective_device


class FiniteGuard:
    """Mixed into the optimizer: a step whose gradients are not all finite, on any rank, is skipped
    (weights and optimizer state unchanged). DeepSpeed calls the step with the reduced gradients, on
    every rank, so the ranks agree; under ZeRO each rank sees its partition, hence the all-reduce."""

    clip_norm: float = 0.0  # > 0: clip here, and report the norm before clipping
    applied: bool = False  # the last step changed the weights; reset it before each step (ZeRO may
    # itself skip a step with an overflow, without calling this one)

    def step(self, closure: Any = None) -> Any:
        params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
        finite = torch.stack([torch.isfinite(p.grad).all() for p in params]).all() if params else torch.tensor(True)
        finite = finite.float().reshape(1).to(collective_device())  # offloaded grads are on the CPU, NCCL's not
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(finite, op=dist.ReduceOp.MIN)
        if self.clip_norm and params:
            norm = torch.nn.utils.clip_grad_norm_(params, self.clip_norm)
            self._global_grad_norm = float(norm)  # DeepSpeed's engine reads it from here
        if not finite.item():
            return None
        self.applied = True
        return super().step(closure)


class GuardedAdamW(FiniteGuard, torch.optim.AdamW):
    pass


def build_optimizer(cfg: EngineConfig, params: Any) -> torch.optim.Optimizer:
    kw = dict(lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)
    optimizers = {"adamw": lambda: GuardedAdamW(params, **kw), "cpu_adam": lambda: _cpu_adam(params, kw)}
    optimizer = optimizers[cfg.optimizer]()
    optimizer.clip_norm = cfg.grad_clip if cfg.zero_stage == 0 else 0.0
    return optimizer


def _cpu_adam(params: Any, kw: dict[str, Any]) -> torch.optim.Optimizer:
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    class GuardedCPUAdam(FiniteGuard, DeepSpeedCPUAdam):
        pass

    return GuardedCPUAdam(params, adamw_mode=True, **kw)


def build_schedule(cfg: EngineConfig, optimizer: torch.optim.Optimizer) -> Any:
    """transformers' scheduler of `cfg.schedule`, stepped by DeepSpeed once per optimizer step."""
    from transformers import get_scheduler

    s = cfg.schedule
    names = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}
    return get_scheduler(names[s.name], optimizer, num_warmup_steps=s.warmup_steps, num_training_steps=s.total_steps)


def finite_guard(engine: Any) -> FiniteGuard:
    """The guarded optimizer inside `engine` (ZeRO wraps it in its own)."""
    optimizer = engine.optimizer
    while not isinstance(optimizer, FiniteGuard):
        optimizer = optimizer.optimizer
    return optimizer
