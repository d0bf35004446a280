"""GMPO: Geometric-Mean Policy Optimization (Zhao et al. 2025, eq. 6-7): the geometric mean of the
token ratios, each clipped in log space, instead of their arithmetic mean.

    ℓ_t = min(log r_t, clip(log r_t, −ε_low, ε_high))   if A_i > 0     (max(...) if A_i < 0:
                                                                        the min of r·A flips sign)
    s_i = exp(1/|o_i| Σ_t ℓ_t)                                          [B]
    J_i = s_i · A_i
Per token, L_t = −A_i · sg[s_i] · (1 + ℓ_t − sg[ℓ_t]): its mean over the answer's tokens
(seq_mean_token_mean) is −J_i in value and in gradient, since ∇s_i = s_i · 1/|o_i| Σ_t ∇ℓ_t.
log s_i is clamped to ±10 (with A < 0 a huge ratio is not clipped).
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import MAX_LOG_RATIO, MAX_WEIGHT_LOG_RATIO, LossOut, PolicyInputs, masked, policy_losses, ratio_metrics


@policy_losses.register("gmpo")
def gmpo(inp: PolicyInputs, logp: torch.Tensor, *, eps_low: float = 0.4, eps_high: float = 0.4) -> LossOut:
    mask, adv = inp.mask, inp.advantages  # [B, T]
    log_r = masked(logp - inp.behaviour_logp, mask).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # [B, T]
    bounded = log_r.clamp(-eps_low, eps_high)
    chosen = torch.where(adv > 0, torch.minimum(log_r, bounded), torch.maximum(log_r, bounded))  # [B, T]
    lengths = mask.sum(-1).clamp(min=1)  # [B]
    log_s = (masked(chosen, mask).sum(-1) / lengths).clamp(-MAX_WEIGHT_LOG_RATIO, MAX_WEIGHT_LOG_RATIO)  # [B]
    s = torch.exp(log_s.detach())[:, None]  # [B, 1]
    loss = masked(-adv * s * (1 + chosen - chosen.detach()), mask)  # [B, T]
    return LossOut(loss, ratio_metrics(torch.exp(log_r.detach()), mask, chosen.detach() != log_r.detach()))
