"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning
Language Models", arXiv 2505.22617): the policy's entropy falls where the log-prob of a token and
its advantage covary; both losses act on the few tokens of highest covariance only.

    Cov_t = (A_t − mean(A)) · (log π_θ(y_t) − mean(log π_θ))      over the batch's trained tokens
    r_t = π_θ(y_t) / π_behaviour(y_t),   PPO's  L_t = −min(r_t A_t, clip(r_t, 1 − ε_low, 1 + ε_high) A_t)

    clip_cov:          among tokens PPO's clip did not already cut, with lb < Cov_t < ub, pick
                       max(1, ⌊ratio · N⌋) at random and stop their gradient (their loss is 0)
    kl_cov:            the max(1, ⌊ratio · N⌋) tokens of largest Cov_t get L_t = −r_t A_t + β |log r_t|,
                       every other token the plain (unclipped) −r_t A_t
with N the trained tokens. Defaults are verl's (ratio 2e-4, lb 1, ub 5; kl_cov's ratio 2e-4 and β 1).

The selection is per micro-batch: means, N and the top-k are over the tokens of the batch the loss is
called on, as verl's are over its micro-batch (its policy loss is called per micro-batch too). With
micro_batch_tokens unset, one mini-batch and one rank, the selection is over the whole step.

Unlike verl, every loss stays bounded at any ratio: Clip-Cov keeps PPO's dual clip for A < 0 (c = 3,
as ppo_clip; dual_clip=None is verl's), and KL-Cov, which clips nothing, clamps log r_t to ±10 (verl
leaves it open: at a log-ratio of 100 its loss is inf).
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import MAX_WEIGHT_LOG_RATIO, LossOut, PolicyInputs, masked, policy_losses, ratio, ratio_metrics
from .ppo import clipped_surrogate


def covariance(adv: torch.Tensor, logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(A_t − mean A) · (log π_t − mean log π) per token, means over the trained tokens; [B, T], no grad."""
    on, n = mask > 0, mask.sum().clamp(min=1)
    adv, logp = adv.detach(), logp.detach()
    centred_adv = adv - masked(adv, mask).sum() / n
    centred_logp = logp - masked(logp, mask).sum() / n
    return torch.where(on, centred_adv * centred_logp, torch.full_like(adv, -torch.inf))


def chosen(count_ratio: float, mask: torch.Tensor) -> int:
    """How many tokens a Cov loss treats: max(1, ⌊ratio · N⌋), as verl."""
    return max(int(count_ratio * mask.sum().item()), 1)


@policy_losses.register("clip_cov")
def clip_cov(inp: PolicyInputs, logp: torch.Tensor, *, eps_low: float = 0.2, eps_high: float = 0.2,
             clip_cov_ratio: float = 2e-4, clip_cov_lb: float = 1.0, clip_cov_ub: float = 5.0,
             dual_clip: float | None = 3.0) -> LossOut:
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio: expected a fraction > 0, got {clip_cov_ratio}")
    out = clipped_surrogate(inp, logp, eps_low, eps_high, dual_clip)  # [B, T], PPO's
    r = ratio(logp.detach(), inp.behaviour_logp)
    adv, mask = inp.advantages, inp.mask
    clipped_by_ppo = (-adv * r.clamp(1 - eps_low, 1 + eps_high)) > (-adv * r)  # verl's clip_by_origin
    cov = covariance(adv, logp, mask)  # [B, T]
    candidates = ((cov > clip_cov_lb) & (cov < clip_cov_ub) & (mask > 0) & ~clipped_by_ppo).nonzero()  # [K, 2]
    picked = candidates[torch.randperm(len(candidates), device=candidates.device)[:chosen(clip_cov_ratio, mask)]]
    keep = torch.ones_like(adv)
    keep[picked[:, 0], picked[:, 1]] = 0.0  # these tokens' gradient (and loss) is cut
    out.metrics["cov_cut_fraction"] = len(picked) / max(mask.sum().item(), 1.0)
    return LossOut(out.token_loss * keep, out.metrics)


@policy_losses.register("kl_cov")
def kl_cov(inp: PolicyInputs, logp: torch.Tensor, *, kl_cov_ratio: float = 2e-4, ppo_kl_coef: float = 1.0) -> LossOut:
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio: expected a fraction > 0, got {kl_cov_ratio}")
    mask, adv = inp.mask, inp.advantages
    log_r = masked(logp - inp.behaviour_logp, mask).clamp(-MAX_WEIGHT_LOG_RATIO, MAX_WEIGHT_LOG_RATIO)  # [B, T]
    r = torch.exp(log_r)
    plain = -adv * r  # [B, T]
    cov = covariance(adv, logp, mask).flatten()  # [B·T], −inf off the mask
    k = min(chosen(kl_cov_ratio, mask), int((mask > 0).sum().item()))
    top = torch.zeros_like(cov, dtype=torch.bool)
    top[torch.topk(cov, k).indices] = True
    top = top.view_as(adv)  # [B, T]
    loss = masked(torch.where(top, plain + ppo_kl_coef * log_r.abs(), plain), mask)  # [B, T]
    metrics = ratio_metrics(r, mask, torch.zeros_like(top))
    metrics["cov_penalised_fraction"] = k / max(mask.sum().item(), 1.0)
    return LossOut(loss, metrics)
