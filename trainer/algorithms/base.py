"""What every training algorithm shares: its registry, its inputs and its named result.

Tensor shapes: B sequences, T positions of the shifted sequence (token t+1 predicted at t).
Every per-token tensor is zero where `mask` is 0 (prompt, padding, observation tokens).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kernel.registry import Registry

policy_losses: Registry = Registry("policy loss")
aggregations: Registry = Registry("aggregation")
kl_estimators: Registry = Registry("kl estimator")


@dataclass
class PolicyInputs:
    """What a policy loss needs besides the current log-probs; all [B, T] float tensors."""

    mask: torch.Tensor  # 1 on response tokens the policy produced and is trained on
    advantages: torch.Tensor  # sequence advantage repeated on each response token
    behaviour_logp: torch.Tensor  # log-probs under the policy that generated the sample
    proximal_logp: torch.Tensor  # log-probs under the weights at the start of this step (no grad)


@dataclass
class LossOut:
    """A per-token loss (to be aggregated) and detached metrics for logging."""

    token_loss: torch.Tensor  # [B, T]
    metrics: dict[str, float] = field(default_factory=dict)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def ratio_metrics(ratio: torch.Tensor, mask: torch.Tensor, clipped: torch.Tensor) -> dict[str, float]:
    """Mean / min / max importance ratio over real tokens and the fraction where clipping bit."""
    ratio, on = ratio.detach(), mask > 0
    if not on.any():
        return {"clip_fraction": 0.0, "ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}
    return {"clip_fraction": masked_mean(clipped.float(), mask).item(),
            "ratio_mean": masked_mean(ratio, mask).item(),
            "ratio_min": ratio[on].min().item(), "ratio_max": ratio[on].max().item()}
