"""REINFORCE (Williams 1992) made off-policy with an importance weight, plain or truncated.

    w_t = π_θ(y_t) / π_behaviour(y_t)            (no gradient through w)
    reinforce:     L_t = -w_t A_t log π_θ(y_t)         (log w_t clamped to ±10)
    truncated_is:  L_t = -min(w_t, c) A_t log π_θ(y_t)
Truncation bounds the variance a stale sample can add: IMPALA's ρ̄ (Espeholt et al. 2018, eq. 1) and
TIS for engine/trainer mismatch (Yao et al. 2025, "Your efficient RL framework secretly brings you
off-policy RL training").
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import MAX_WEIGHT_LOG_RATIO, LossOut, PolicyInputs, masked, policy_losses, ratio, ratio_metrics


@policy_losses.register("reinforce")
def reinforce(inp: PolicyInputs, logp: torch.Tensor) -> LossOut:
    log_w = (logp.detach() - inp.behaviour_logp).clamp(-MAX_WEIGHT_LOG_RATIO, MAX_WEIGHT_LOG_RATIO)
    weight = torch.exp(log_w)  # [B, T], at most e^10: nothing else bounds it
    loss = masked(-weight * inp.advantages * logp, inp.mask)  # [B, T]
    return LossOut(loss, ratio_metrics(weight, inp.mask, torch.zeros_like(weight, dtype=torch.bool)))


@policy_losses.register("truncated_is")
def truncated_is(inp: PolicyInputs, logp: torch.Tensor, *, cap: float = 2.0) -> LossOut:
    r = ratio(logp.detach(), inp.behaviour_logp)  # [B, T]
    weight = r.clamp(max=cap)  # [B, T]
    loss = masked(-weight * inp.advantages * logp, inp.mask)  # [B, T]
    return LossOut(loss, ratio_metrics(r, inp.mask, r > cap))
