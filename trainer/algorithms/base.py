"""What every training algorithm shares: its registry, its inputs and its named result.

Tensor shapes: B sequences, T positions of the shifted sequence (token t+1 predicted at t).
Every per-token tensor is zero where `mask` is 0 (prompt, padding, observation tokens).

Numbers stay finite: log-ratios are clamped to ±20 before `exp` (as verl does; e^20 ≈ 4.9e8 is
still finite in fp32, so 0 × it is 0 in the backward pass too), to ±10 where no clip bounds the
weight, and masking uses `torch.where`, because an overflow at a masked position times a mask of 0
is NaN, not 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from undertow.kernel.lazy import torch

from undertow.kernel.registry import Registry

policy_losses: Registry = Registry("policy loss")
aggregations: Registry = Registry("aggregation")
kl_estimators: Registry = Registry("kl estimator")
advantage_transforms: Registry = Registry("advantage transform")

MAX_LOG_RATIO = 20.0
# An importance weight no clip bounds (a sequence's ratio, REINFORCE's weight) is clamped harder:
# e^10 ≈ 2.2e4, verl's bound on GSPO's sequence ratio.
MAX_WEIGHT_LOG_RATIO = 10.0


@dataclass
class PolicyInputs:
    """What a policy loss needs besides the current log-probs; all [B, T] float tensors."""

    mask: torch.Tensor  # 1 on response tokens the policy produced and is trained on
    advantages: torch.Tensor  # sequence advantage repeated on each response token
    behaviour_logp: torch.Tensor  # log-probs under the policy that generated the sample
    proximal_logp: torch.Tensor  # log-probs under the weights at the start of this step (no grad)


@dataclass
class AdvantageInputs:
    """What a trainer-side advantage transform sees: the WHOLE step's batch (every rank the same),
    response-aligned: column j is response token j of row i. All [B, L] float64 but `rewards` [B]."""

    mask: torch.Tensor  # 1 on trained response tokens; 0 on observation tokens and padding
    advantages: torch.Tensor  # what the processors computed (a sequence's scalar on each of its tokens)
    rewards: torch.Tensor  # [B] the outcome reward of each sequence
    kl_penalty: torch.Tensor  # β · KL_t(π_behaviour ‖ π_ref) when the KL goes into the reward, else zeros
    values: torch.Tensor | None = None  # V(s_t) of the critic at the step's start; None without a critic


@dataclass
class AdvantageOut:
    """What a transform that trains a critic returns (a plain one returns the advantages alone):
    the advantages [B, L] and the critic's regression targets, the returns [B, L]."""

    advantages: torch.Tensor
    returns: torch.Tensor


@dataclass
class LossOut:
    """A per-token loss (to be aggregated) and detached metrics for logging."""

    token_loss: torch.Tensor  # [B, T]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Totals:
    """The normalisers of one optimizer step: its trained tokens and its sequences, over every
    micro-batch and rank. Aggregating a micro-batch against them makes the summed micro-batch
    losses equal the loss of the step in one pass."""

    tokens: float
    sequences: int

    @classmethod
    def of(cls, mask: torch.Tensor) -> "Totals":
        return cls(float(mask.sum()), int(mask.shape[0]))


def masked(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x where mask is on, else 0 (also where x is inf or NaN)."""
    return torch.where(mask > 0, x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked(x, mask).sum() / mask.sum().clamp(min=1)


def ratio(logp: torch.Tensor, other_logp: torch.Tensor) -> torch.Tensor:
    """π / π_other from log-probs, the log-ratio clamped to ±MAX_LOG_RATIO first."""
    return torch.exp((logp - other_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


def ratio_metrics(r: torch.Tensor, mask: torch.Tensor, clipped: torch.Tensor) -> dict[str, float]:
    """Importance-ratio statistics over real tokens: mean / min / max, the fraction where clipping
    bit (below 1 and above 1 apart), and PPO's approximate KL, mean of (r − 1) − log r."""
    r, on = r.detach(), mask > 0
    if not on.any():
        return {"clip_fraction": 0.0, "clip_fraction_low": 0.0, "clip_fraction_high": 0.0, "approx_kl": 0.0,
                "ratio_mean": 1.0, "ratio_min": 1.0, "ratio_max": 1.0}
    clipped = clipped & on
    return {"clip_fraction": masked_mean(clipped.to(r.dtype), mask).item(),
            "clip_fraction_low": masked_mean((clipped & (r < 1)).to(r.dtype), mask).item(),
            "clip_fraction_high": masked_mean((clipped & (r > 1)).to(r.dtype), mask).item(),
            "approx_kl": masked_mean(r - 1 - torch.log(r), mask).item(),
            "ratio_mean": masked_mean(r, mask).item(),
            "ratio_min": r[on].min().item(), "ratio_max": r[on].max().item()}
