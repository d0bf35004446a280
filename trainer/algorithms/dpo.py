"""Preference losses on pairs, from summed response log-probs. With the policy's log-ratio to the
reference on the chosen (w) and the rejected (l) answer,

    m = (log π_θ(y_w) − log π_ref(y_w)) − (log π_θ(y_l) − log π_ref(y_l))        [P]

each loss is a function of m, averaged over pairs:
    sigmoid  −log σ(β m)                                     DPO (Rafailov et al. 2023, eq. 7)
    robust   (−(1−ε) log σ(β m) + ε log σ(−β m)) / (1 − 2ε)  labels flipped with probability ε
                                                             (Chowdhury et al. 2024, eq. 7; TRL's "robust")
    hinge    max(0, 1 − β m)                                 SLiC (Zhao et al. 2023, eq. 3)
    ipo      (m − 1/(2β))²                                   IPO (Azar et al. 2023, eq. 17), on summed
                                                             log-probs as the paper writes it (TRL
                                                             averages them over tokens instead)
"""

from __future__ import annotations

from dataclasses import dataclass

from undertow.kernel.lazy import functional as F, torch

from undertow.kernel.registry import Registry

preference_losses: Registry = Registry("preference loss")


@dataclass
class DPOOut:
    loss: torch.Tensor  # scalar
    reward_margin: float  # mean m: how much more the policy prefers y_w than the reference does
    accuracy: float  # fraction of pairs with m > 0


@preference_losses.register("sigmoid")
def sigmoid(m: torch.Tensor, beta: float) -> torch.Tensor:
    return -F.logsigmoid(beta * m)  # [P]


@preference_losses.register("robust")
def robust(m: torch.Tensor, beta: float, *, label_smoothing: float = 0.1) -> torch.Tensor:
    if not 0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing: expected a flip probability in [0, 0.5), got {label_smoothing}")
    eps = label_smoothing
    return (-(1 - eps) * F.logsigmoid(beta * m) + eps * F.logsigmoid(-beta * m)) / (1 - 2 * eps)  # [P]


@preference_losses.register("hinge")
def hinge(m: torch.Tensor, beta: float) -> torch.Tensor:
    return torch.relu(1 - beta * m)  # [P]


@preference_losses.register("ipo")
def ipo(m: torch.Tensor, beta: float) -> torch.Tensor:
    return (m - 1 / (2 * beta)) ** 2  # [P]


def dpo_loss(chosen_logp: torch.Tensor, rejected_logp: torch.Tensor, chosen_ref: torch.Tensor,
             rejected_ref: torch.Tensor, beta: float = 0.1, loss=sigmoid) -> DPOOut:
    """All inputs [P] (summed log-probs per pair); `loss` one of `preference_losses`, bound to its options."""
    m = (chosen_logp - chosen_ref) - (rejected_logp - rejected_ref)  # [P]
    return DPOOut(loss(m, beta).mean(), m.detach().mean().item(), (m > 0).float().mean().item())
