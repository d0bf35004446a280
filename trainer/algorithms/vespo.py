"""VESPO: Variational Sequence-Level Soft Policy Optimization (arXiv 2602.10693), as TRL's GRPOTrainer
computes it (`loss_type: vespo`). No hard clip: the whole answer's importance weight w scales its
gradient through a Gamma-shaped curve that is 1 at w = 1 and falls off on both sides, steeper for
negative advantages:

    log w = clamp(Σ_t clamp(log π_θ(y_t) − log π_behaviour(y_t), ±20), log 1e-8, 20)   sequence [B]
    φ(w)  = e^λ · w^k · e^(−λ w) = exp(λ + k log w − λ w)                               (no gradient)
    (k, λ) = (k₊, λ₊) for A_t ≥ 0, (k₋, λ₋) for A_t < 0             TRL's defaults (2, 3) and (3, 2)
    L_t   = −φ(w) · A_t · log π_θ(y_t)

φ peaks at w = k/λ, at (k/λ)^k e^(λ−k): 1.21 for (2, 3), 1.24 for (3, 2), so the loss stays within
1.24 |A log π|. The behaviour log-probs are the sampler's, so w also carries the engine/trainer
mismatch that TRL folds in from its vLLM importance ratio. TRL picks (k, λ) by the sequence's
advantage; here by each token's, which is the same for a sequence advantage and also serves a
per-token one (GAE). TRL aggregates over all tokens (its "dapo" normaliser): token_mean here.
"""

from __future__ import annotations

import math

from undertow.kernel.lazy import torch

from .base import MAX_LOG_RATIO, LossOut, PolicyInputs, masked, policy_losses, ratio_metrics

LOG_W_MIN = math.log(1e-8)  # TRL's lower clamp of log w (it matches the paper's own code)


def gamma_weights(log_w: torch.Tensor, advantages: torch.Tensor, k_pos: float, lambda_pos: float, k_neg: float,
                  lambda_neg: float) -> torch.Tensor:
    """φ(w) from log w and the advantages whose sign picks (k, λ), broadcast together."""
    positive = advantages >= 0
    k = torch.where(positive, k_pos, k_neg)
    lam = torch.where(positive, lambda_pos, lambda_neg).clamp(min=1e-4)
    return torch.exp(lam + k * log_w - lam * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


@policy_losses.register("vespo")
def vespo(inp: PolicyInputs, logp: torch.Tensor, *, k_pos: float = 2.0, lambda_pos: float = 3.0, k_neg: float = 3.0,
          lambda_neg: float = 2.0) -> LossOut:
    """TRL's VESPO loss; k (power) and λ (decay) for positive and negative advantages."""
    for name, value in (("k_pos", k_pos), ("lambda_pos", lambda_pos), ("k_neg", k_neg), ("lambda_neg", lambda_neg)):
        if value <= 0:
            raise ValueError(f"{name}: expected > 0, got {value}")
    log_r = masked((logp.detach() - inp.behaviour_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO), inp.mask)  # [B, T]
    log_w = log_r.sum(-1, keepdim=True).clamp(LOG_W_MIN, MAX_LOG_RATIO)  # [B, 1]
    phi = gamma_weights(log_w, inp.advantages, k_pos, lambda_pos, k_neg, lambda_neg)  # [B, T]
    loss = masked(-phi * inp.advantages * logp, inp.mask)  # [B, T]
    w = torch.exp(log_w).expand_as(logp)
    metrics = ratio_metrics(w, inp.mask, torch.zeros_like(inp.mask, dtype=torch.bool))
    metrics["vespo_phi_mean"] = (masked(phi, inp.mask).sum() / inp.mask.sum().clamp(min=1)).item()
    return LossOut(loss, metrics)
