"""Decoupled PPO (Hilton et al. 2021, "Batch size-invariance for policy optimization", eq. 2;
used for asynchronous RL by AReaL, Fu et al. 2025, eq. 5): the behaviour policy that sampled the
data and the proximal policy the update is trusted around are two different policies.

    w_t = sg[π_prox(y_t) / π_behaviour(y_t)]     off-policy correction, optionally capped
    r_t = π_θ(y_t) / π_prox(y_t)                  trust region around the proximal policy
    L_t = -w_t · min(r_t A_t, clip(r_t, 1 - ε, 1 + ε) A_t)
π_prox is the trainer's weights at the start of the step, before its first update: with several
PPO epochs or mini-batches per step, π_θ moves away from it and the clip binds.
"""

from __future__ import annotations

import torch

from .base import LossOut, PolicyInputs, masked, masked_mean, policy_losses, ratio, ratio_metrics


@policy_losses.register("decoupled_ppo")
def decoupled_ppo(inp: PolicyInputs, logp: torch.Tensor, *, eps: float = 0.2,
                  max_behaviour_weight: float | None = None) -> LossOut:
    weight = ratio(inp.proximal_logp, inp.behaviour_logp)  # [B, T], no gradient
    if max_behaviour_weight is not None:
        weight = weight.clamp(max=max_behaviour_weight)
    r = ratio(logp, inp.proximal_logp)  # [B, T]
    unclipped = r * inp.advantages
    clipped = r.clamp(1 - eps, 1 + eps) * inp.advantages
    loss = masked(-weight * torch.minimum(unclipped, clipped), inp.mask)  # [B, T]
    metrics = ratio_metrics(r, inp.mask, clipped < unclipped)
    metrics["behaviour_weight_mean"] = masked_mean(weight, inp.mask).item()
    return LossOut(loss, metrics)
