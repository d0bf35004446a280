"""DPPO: Divergence Proximal Policy Optimization ("Rethinking the Trust Region in LLM Reinforcement
Learning", arXiv 2602.04879; verl's dppo_tv / dppo_kl). PPO's trust region is a box on the ratio
π_θ/π_old, which over-penalises rare tokens (1e-5 → 1e-3 is a ratio of 100, a negligible move) and
under-penalises likely ones (0.99 → 0.8 is a ratio of 0.81, a large one). DPPO bounds a divergence
between the two token distributions, binarised on the sampled token (p = π_θ(y_t), q = π_behaviour(y_t)):

    Binary-TV:  D = p − q                                      (signed: the side A pushes towards)
    Binary-KL:  D = q log(q/p) + (1 − q) log((1 − q)/(1 − p))
    valid_t = D ≤ δ_high or p ≤ q   if A_t > 0      (stop pushing p up once it has moved enough)
              D ≥ −δ_low ...        if A_t < 0      (TV: p − q ≥ −δ_low; KL: D ≤ δ_low or p ≥ q)
    L_t = −A_t · sg[min(r_t, c)] · log π_θ(y_t) · sg[valid_t],   r_t = p / q
δ: TV 0.15, KL 0.05 (verl's example); c = 20 truncates the importance weight (verl's clip_ratio_c
default). The paper recommends measuring against the rollout policy (undertow's behaviour log-probs:
what it does) and Dr. GRPO's advantage and normaliser. |L_t| ≤ c · |A_t| · |log π_θ(y_t)|.
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import LossOut, PolicyInputs, masked, policy_losses, ratio, ratio_metrics

BINARY_KL_EPS = 1e-8  # verl's, inside the log of the complements


def truncated_pg(inp: PolicyInputs, logp: torch.Tensor, valid: torch.Tensor, truncate: float) -> LossOut:
    """−A · sg[min(r, c)] · log π on the valid tokens: DPPO's loss given its mask."""
    if truncate <= 0:
        raise ValueError(f"truncate: expected a cap > 0 on the importance weight, got {truncate}")
    r = ratio(logp.detach(), inp.behaviour_logp)  # [B, T]
    weight = r.clamp(max=truncate)  # [B, T]
    loss = masked(-inp.advantages * weight * logp * valid.to(logp.dtype), inp.mask)  # [B, T]
    return LossOut(loss, ratio_metrics(r, inp.mask, ~valid))


@policy_losses.register("dppo_tv")
def dppo_tv(inp: PolicyInputs, logp: torch.Tensor, *, delta_low: float = 0.15, delta_high: float = 0.15,
            truncate: float = 20.0) -> LossOut:
    moved = torch.exp(logp.detach()) - torch.exp(inp.behaviour_logp)  # [B, T], p − q
    valid = torch.where(inp.advantages > 0, moved <= delta_high, moved >= -delta_low)  # [B, T]
    return truncated_pg(inp, logp, valid, truncate)


@policy_losses.register("dppo_kl")
def dppo_kl(inp: PolicyInputs, logp: torch.Tensor, *, delta_low: float = 0.05, delta_high: float = 0.05,
            truncate: float = 20.0) -> LossOut:
    lp, lq = logp.detach(), inp.behaviour_logp
    p, q = torch.exp(lp), torch.exp(lq)  # [B, T]
    kl = q * (lq - lp) + (1 - q) * torch.log((1 - q + BINARY_KL_EPS) / (1 - p + BINARY_KL_EPS))  # [B, T]
    valid = torch.where(inp.advantages > 0, (kl <= delta_high) | (p <= q), (kl <= delta_low) | (p >= q))
    return truncated_pg(inp, logp, valid, truncate)
