"""KL(π_θ ‖ π_ref) per token from samples of π_θ, and the policy's entropy.

Estimators of Schulman (2020), "Approximating KL Divergence", with log r = log π_ref − log π_θ:
    k1 = −log r                 unbiased, high variance, can be negative
    k2 = ½ (log r)²             biased, low variance
    k3 = (r − 1) − log r        unbiased, low variance, always ≥ 0
k3 grows like e^|log r|: as verl does, log r is clamped to ±20 and k3 to ≤ 10, so that one token
far from the reference cannot dominate (or overflow) the loss and its gradient.
"""

from __future__ import annotations

import torch

from .base import MAX_LOG_RATIO, kl_estimators

MAX_K3 = 10.0


@kl_estimators.register("k1")
def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp  # [B, T]


@kl_estimators.register("k2")
def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (ref_logp - logp) ** 2  # [B, T]


@kl_estimators.register("k3")
def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    log_r = (ref_logp - logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # [B, T]
    return (torch.exp(log_r) - 1 - log_r).clamp(max=MAX_K3)


def entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """H(softmax(logits / temperature)) per position: logits [B, T, V] -> [B, T], in fp32 at least."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    logp = torch.log_softmax(z, dim=-1)
    return -(logp.exp() * logp).sum(-1)
