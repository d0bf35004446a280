"""CISPO (MiniMax-M1, 2025, eq. 4): clip the importance-sampling weight, not the update.

    r_t = π_θ(y_t) / π_behaviour(y_t)
    L_t = -sg[clip(r_t, 1 - ε_low, 1 + ε_high)] · A_t · log π_θ(y_t)
Every token keeps a gradient (PPO's clip zeroes it for clipped tokens). M1 leaves the lower bound
open (a large ε_low) and tunes only ε_high.
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import LossOut, PolicyInputs, masked, policy_losses, ratio, ratio_metrics


@policy_losses.register("cispo")
def cispo(inp: PolicyInputs, logp: torch.Tensor, *, eps_low: float = 1.0, eps_high: float = 0.28) -> LossOut:
    r = ratio(logp.detach(), inp.behaviour_logp)  # [B, T], no gradient
    weight = r.clamp(1 - eps_low, 1 + eps_high)  # [B, T]
    loss = masked(-weight * inp.advantages * logp, inp.mask)  # [B, T]
    return LossOut(loss, ratio_metrics(r, inp.mask, weight != r))
