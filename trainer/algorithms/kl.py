"""KL(π_θ ‖ π_ref) per token from samples of π_θ, and the policy's entropy.

Estimators of Schulman (2020), "Approximating KL Divergence", with log r = log π_ref − log π_θ:
    k1 = −log r                 unbiased, high variance, can be negative
    k2 = ½ (log r)²             biased, low variance
    k3 = (r − 1) − log r        unbiased, low variance, always ≥ 0
    abs = |log r|               biased (an upper bound of k1's mean), verl's `abs`
k3 grows like e^|log r|: as verl does, log r is clamped to ±20 and k3 to ≤ 10, so that one token
far from the reference cannot dominate (or overflow) the loss and its gradient. verl calls this
clamped k3 `low_var_kl`; both names are registered.

k1 and k3 estimate the KL's value without bias, but their gradients are not the KL's gradient; k2's
is (Schulman 2020; arXiv 2505.17508, which verl cites for the trick). verl's straight-through variants `k1+` / `k3+` take the value of k1 / k3 and the
gradient of k2:   k+ = k2 − sg[k2] + sg[k].

TRL's `use_bias_correction_kl` (KLConfig.bias_correction) multiplies the per-token KL by the
importance ratio π_θ/π_behaviour, since the tokens were sampled from π_behaviour, not π_θ:
E_{π_behaviour}[π_θ/π_behaviour · k] = E_{π_θ}[k]. TRL keeps the gradient through the ratio (its
GRPOTrainer multiplies by coef_1 = exp(log π_θ − log π_old) before any detach), and so does undertow;
the ratio's log is clamped to ±10, as every unclipped weight here.
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import MAX_LOG_RATIO, MAX_WEIGHT_LOG_RATIO, kl_estimators

MAX_K3 = 10.0


@kl_estimators.register("k1")
def k1(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return logp - ref_logp  # [B, T]


@kl_estimators.register("k2")
def k2(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return 0.5 * (ref_logp - logp) ** 2  # [B, T]


@kl_estimators.register("abs")
def abs_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return (logp - ref_logp).abs()  # [B, T]; its gradient is sign(log π_θ − log π_ref)


@kl_estimators.register("k3")
@kl_estimators.register("low_var_kl")
def k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    log_r = (ref_logp - logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # [B, T]
    return (torch.exp(log_r) - 1 - log_r).clamp(max=MAX_K3)


def straight_through(value: torch.Tensor, logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """`value` in the forward pass, k2's gradient in the backward pass (verl's kl_penalty with a "+")."""
    grad_of = k2(logp, ref_logp)  # [B, T]
    return grad_of - grad_of.detach() + value.detach()


@kl_estimators.register("k1+")
def k1_plus(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return straight_through(k1(logp, ref_logp), logp, ref_logp)


@kl_estimators.register("k3+")
def k3_plus(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    return straight_through(k3(logp, ref_logp), logp, ref_logp)


def bias_corrected(kl: torch.Tensor, logp: torch.Tensor, behaviour_logp: torch.Tensor) -> torch.Tensor:
    """kl · π_θ/π_behaviour, the gradient flowing through the ratio too (TRL's use_bias_correction_kl)."""
    return kl * torch.exp((logp - behaviour_logp).clamp(-MAX_WEIGHT_LOG_RATIO, MAX_WEIGHT_LOG_RATIO))


def entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """H(softmax(logits / temperature)) per position: logits [B, T, V] -> [B, T], in fp32 at least."""
    z = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    logp = torch.log_softmax(z, dim=-1)
    return -(logp.exp() * logp).sum(-1)
