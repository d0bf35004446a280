"""SimPO: Simple Preference Optimization with a reference-free reward (Meng et al. 2024, eq. 6; TRL's
CPOTrainer with loss_type "simpo" and cpo_alpha 0).

The implicit reward is the length-normalised log-likelihood of the policy alone (no reference model):

    r(x, y) = β / |y| · log π_θ(y|x) = β · mean_t log π_θ(y_t | x, y_<t)

and with a target margin γ > 0 between the chosen (w) and the rejected (l) answer,

    L_SimPO = −log σ( β/|y_w| log π_θ(y_w|x) − β/|y_l| log π_θ(y_l|x) − γ )        averaged over pairs

TRL writes the margin as β (Δ − γ/β) with `simpo_gamma` = γ/β; the value is the same.
"""

from __future__ import annotations

from dataclasses import dataclass

from undertow.kernel.lazy import functional as F, torch


@dataclass
class SimPOOut:
    losses: torch.Tensor  # [P]
    reward_margin: float  # mean over pairs of the length-normalised log-prob difference (before β)
    accuracy: float  # fraction of pairs whose chosen answer has the higher normalised log-prob


def length_normalised(summed_logp: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """mean log-prob per response token: [N] / [N]; a row with no tokens counts as 0, never NaN."""
    return summed_logp / lengths.clamp(min=1)  # [N]


def simpo_loss(chosen_logp: torch.Tensor, rejected_logp: torch.Tensor, chosen_len: torch.Tensor,
               rejected_len: torch.Tensor, *, beta: float = 2.0, gamma: float = 1.0) -> SimPOOut:
    """Inputs [P]: summed policy log-probs of each answer and its number of response tokens."""
    delta = length_normalised(chosen_logp, chosen_len) - length_normalised(rejected_logp, rejected_len)  # [P]
    losses = -F.logsigmoid(beta * delta - gamma)  # [P]; softplus form: finite for any finite delta
    d = delta.detach()
    return SimPOOut(losses, d.mean().item(), (d > 0).float().mean().item())
