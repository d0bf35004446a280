"""DPO, sigmoid loss (Rafailov et al. 2023, eq. 7), from summed response log-probs.

    h = β [ (log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l)) ]
    L = −log σ(h)           averaged over pairs; β ~ 0.1
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DPOOut:
    loss: torch.Tensor  # scalar
    reward_margin: float  # mean h / β: how much more the policy prefers y_w than the reference does
    accuracy: float  # fraction of pairs with h > 0


def dpo_loss(chosen_logp: torch.Tensor, rejected_logp: torch.Tensor, chosen_ref: torch.Tensor,
             rejected_ref: torch.Tensor, beta: float = 0.1) -> DPOOut:
    """All inputs [P] (summed log-probs per pair)."""
    margin = (chosen_logp - chosen_ref) - (rejected_logp - rejected_ref)  # [P]
    h = beta * margin
    loss = -F.logsigmoid(h).mean()
    return DPOOut(loss, margin.detach().mean().item(), (h > 0).float().mean().item())
