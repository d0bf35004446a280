"""Rollout correction: importance weights for the gap between the engine that sampled an answer and
the trainer's own computation of the same policy (verl's `rollout_is`, decoupled mode).

With vLLM generating and DeepSpeed training, the log-probs the engine recorded (π_rollout, the
records' behaviour log-probs) differ from what the trainer computes for the same weights (π_old, the
step's proximal log-probs): other kernels, another precision, another batch. The policy loss then
takes π_old as the policy that sampled (its ratio, its clip), and each token's loss is multiplied by
a weight that moves the expectation from π_rollout to π_old:

    log ρ_t = log π_old(y_t) − log π_rollout(y_t)                  clamped to ±20 (verl's bound)
    token:     w_t = ρ_t
    sequence:  w_t = Π_s ρ_s over the answer's trained tokens      (one weight per answer)
    TIS   w ← min(w, C)                     truncated (Yao et al. 2025, "Your efficient RL framework
                                            secretly brings you off-policy RL training")
    MIS   w ← w · 1[lo ≤ w ≤ C]             masked: a token (or answer) outside the band is dropped
                                            (verl's "lower_upper" threshold, IcePop)
    L_t ← sg[w_t] · L_t(π_θ; π_old)
Weights are 0 where the mask is; they carry no gradient. verl's optional batch normalisation of the
weights (mean 1) is not offered: it would make a micro-batch's loss depend on the others'.
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import MAX_LOG_RATIO, masked, masked_mean

LEVELS = ("token", "sequence")


def rollout_weights(proximal_logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor, *,
                    level: str = "token", threshold: float = 2.0,
                    lower: float | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """(w [B, T], metrics): TIS weights capped at `threshold`, or with `lower` MIS weights kept only
    inside [lower, threshold]; `level` token or sequence."""
    if level not in LEVELS:
        raise ValueError(f"level: expected one of {LEVELS}, got {level!r}")
    gap = masked(proximal_logp.detach() - behaviour_logp, mask)  # [B, T]  log ρ_t
    log_rho = gap.sum(-1, keepdim=True).expand_as(gap) if level == "sequence" else gap  # the answer's on each token
    raw = masked(torch.exp(log_rho.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)), mask)  # [B, T]
    if lower is None:
        weights, cut = raw.clamp(max=threshold), raw > threshold
    else:
        kept = (raw >= lower) & (raw <= threshold)
        weights, cut = torch.where(kept, raw, torch.zeros_like(raw)), ~kept
    on = mask > 0
    metrics = {"rollout_is_mean": masked_mean(weights, mask).item(),
               "rollout_is_raw_max": raw[on].max().item() if on.any() else 1.0,
               "rollout_is_cut_fraction": masked_mean(cut.to(raw.dtype), mask).item(),
               "rollout_mismatch_k1": masked_mean(-gap, mask).item()}
    return weights, metrics
