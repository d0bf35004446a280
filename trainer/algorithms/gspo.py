"""GSPO: Group Sequence Policy Optimization (Zheng et al. 2025), sequence-level importance ratio.

    s_i = exp( mean_t log(π_θ(y_t) / π_behaviour(y_t)) )          (eq. 7, length-normalised)
    GSPO-token (eq. 13): s_i,t = sg[s_i] · π_θ(y_t) / sg[π_θ(y_t)]  — same value and gradient
    L_i,t = -min(s_i,t A_i, clip(s_i,t, 1 - ε_low, 1 + ε_high) A_i)
The paper's ranges are tiny (ε_low = 3e-4, ε_high = 4e-4); pair it with seq_mean_token_mean.
log s_i is clamped to ±10 (verl's bound): with A < 0 nothing else bounds s_i A.
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import MAX_WEIGHT_LOG_RATIO, LossOut, PolicyInputs, masked, policy_losses, ratio_metrics


@policy_losses.register("gspo")
def gspo(inp: PolicyInputs, logp: torch.Tensor, *, eps_low: float = 3e-4, eps_high: float = 4e-4) -> LossOut:
    mask = inp.mask  # [B, T]
    lengths = mask.sum(-1).clamp(min=1)  # [B]
    log_s = masked(logp - inp.behaviour_logp, mask).sum(-1) / lengths  # [B]
    log_s = log_s.clamp(-MAX_WEIGHT_LOG_RATIO, MAX_WEIGHT_LOG_RATIO)  # as verl: s <= e^10
    lp = masked(logp, mask)  # an overflow at a masked position must not reach the exp
    s_token = torch.exp(log_s.detach()[:, None] + lp - lp.detach())  # [B, T], value s_i everywhere
    adv = inp.advantages  # [B, T]
    unclipped = s_token * adv
    clipped = s_token.clamp(1 - eps_low, 1 + eps_high) * adv
    loss = masked(-torch.minimum(unclipped, clipped), mask)  # [B, T]
    return LossOut(loss, ratio_metrics(s_token, mask, clipped < unclipped))
