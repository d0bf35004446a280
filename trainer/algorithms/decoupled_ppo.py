"""Decoupled PPO (Hilton et al. 2021, "Batch size-invariance for policy optimization", eq. 2;
used for asynchronous RL by AReaL, Fu et al. 2025, eq. 5): the behaviour policy that sampled the
data and the proximal policy the update is trusted around are two different policies.

    w_t = sg[π_prox(y_t) / π_behaviour(y_t)]     off-policy correction, optionally capped
    r_t = π_θ(y_t) / π_prox(y_t)                  trust region around the proximal policy
    L_t = -w_t · min(r_t A_t, clip(r_t, 1 - ε, 1 + ε) A_t)     (and PPO's dual clip for A_t < 0)
log w_t is clamped to ±10 when `max_behaviour_weight` does not cap it lower.
π_prox is the trainer's weights at the start of the step, before its first update: with several
PPO epochs or mini-batches per step, π_θ moves away from it and the clip binds.
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import MAX_WEIGHT_LOG_RATIO, LossOut, PolicyInputs, masked, masked_mean, policy_losses
from .ppo import clipped_surrogate


@policy_losses.register("decoupled_ppo")
def decoupled_ppo(inp: PolicyInputs, logp: torch.Tensor, *, eps: float = 0.2,
                  max_behaviour_weight: float | None = None, dual_clip: float | None = 3.0) -> LossOut:
    log_w = (inp.proximal_logp - inp.behaviour_logp).clamp(-MAX_WEIGHT_LOG_RATIO, MAX_WEIGHT_LOG_RATIO)
    weight = torch.exp(log_w)  # [B, T], no gradient; at most e^10 when not capped lower
    if max_behaviour_weight is not None:
        weight = weight.clamp(max=max_behaviour_weight)
    proximal = PolicyInputs(mask=inp.mask, advantages=inp.advantages, behaviour_logp=inp.proximal_logp,
                            proximal_logp=inp.proximal_logp)
    out = clipped_surrogate(proximal, logp, eps, eps, dual_clip)  # the trust region around π_prox
    out.metrics["behaviour_weight_mean"] = masked_mean(weight, inp.mask).item()
    return LossOut(masked(weight * out.token_loss, inp.mask), out.metrics)
