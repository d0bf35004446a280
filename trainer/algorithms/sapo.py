"""SAPO: Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen, arXiv 2511.20347, eq. 5-6 and 10-12):
a smooth, temperature-controlled gate on the importance ratio instead of PPO's hard clip.

    r_t = π_θ(y_t) / π_behaviour(y_t)
    τ = τ_pos if A_t > 0 else τ_neg                  (negative advantages decay faster: τ_neg > τ_pos)
    f(r) = 4/τ · σ(τ (r − 1))                        at r = 1: f = 2/τ and f'(1) = 1, PPO's gradient
    L_t = −f(r_t) · A_t
The gradient weight f'(r) = 4 σ(τ(r−1)) (1 − σ(τ(r−1))) fades smoothly as r leaves 1 instead of
dropping to 0 at 1 ± ε, so an off-policy token is down-weighted, not cut. |L_t| ≤ 4/τ · |A_t| whatever
the ratio (log r is clamped to ±20 before the exp, as verl does). Defaults τ_pos = 1.0, τ_neg = 1.05
and seq_mean_token_mean aggregation, as verl's and TRL's SAPO.
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import LossOut, PolicyInputs, masked, policy_losses, ratio, ratio_metrics


@policy_losses.register("sapo")
def sapo(inp: PolicyInputs, logp: torch.Tensor, *, tau_pos: float = 1.0, tau_neg: float = 1.05) -> LossOut:
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"tau_pos / tau_neg: expected temperatures > 0, got {tau_pos} / {tau_neg}")
    r = ratio(logp, inp.behaviour_logp)  # [B, T]
    adv = inp.advantages  # [B, T]
    tau = torch.where(adv > 0, torch.full_like(adv, tau_pos), torch.full_like(adv, tau_neg))  # [B, T]
    gate = 4.0 / tau * torch.sigmoid(tau * (r - 1))  # [B, T]
    loss = masked(-gate * adv, inp.mask)  # [B, T]
    return LossOut(loss, ratio_metrics(r, inp.mask, torch.zeros_like(r, dtype=torch.bool)))
