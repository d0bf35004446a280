"""PPO clipped surrogate (Schulman et al. 2017), its dual clip (Ye et al. 2020, "Mastering Complex
Control in MOBA Games with Deep RL", eq. 5) and DAPO's clip-higher (Yu et al. 2025, eq. 10).

    r_t = π_θ(y_t) / π_behaviour(y_t)
    L_t = -min(r_t A_t, clip(r_t, 1 - ε_low, 1 + ε_high) A_t)
    dual clip, for A_t < 0:  L_t = min(L_t, -c A_t)   (bounds the loss of a huge ratio, c > 1)
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import LossOut, PolicyInputs, masked, policy_losses, ratio, ratio_metrics


def clipped_surrogate(inp: PolicyInputs, logp: torch.Tensor, eps_low: float, eps_high: float,
                      dual_clip: float | None) -> LossOut:
    r = ratio(logp, inp.behaviour_logp)  # [B, T]
    adv = inp.advantages  # [B, T]
    unclipped = r * adv
    clipped = r.clamp(1 - eps_low, 1 + eps_high) * adv
    loss = -torch.minimum(unclipped, clipped)  # [B, T]
    bit = clipped < unclipped  # the clipped branch was taken
    if dual_clip is not None:
        if dual_clip <= 1:
            raise ValueError(f"dual_clip: expected a constant > 1, got {dual_clip}")
        loss = torch.where(adv < 0, torch.minimum(loss, -dual_clip * adv), loss)
    return LossOut(masked(loss, inp.mask), ratio_metrics(r, inp.mask, bit))


@policy_losses.register("ppo_clip")
def ppo_clip(inp: PolicyInputs, logp: torch.Tensor, *, eps: float = 0.2, dual_clip: float | None = 3.0) -> LossOut:
    """PPO's symmetric clip, with the dual clip's bound for negative advantages (3, verl's default;
    None: without it, a stale token's loss can reach e^20 · |A|)."""
    return clipped_surrogate(inp, logp, eps, eps, dual_clip)


@policy_losses.register("dapo")
def dapo(inp: PolicyInputs, logp: torch.Tensor, *, eps_low: float = 0.2, eps_high: float = 0.28,
         dual_clip: float | None = 3.0) -> LossOut:
    """DAPO clip-higher: a wider upper bound lets low-probability tokens rise (against entropy collapse)."""
    return clipped_surrogate(inp, logp, eps_low, eps_high, dual_clip)
