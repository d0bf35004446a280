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
    sigmoid_norm  −log σ(β m̄)                                TRL's "sigmoid_norm": DPO on the margin
                                                             of per-token log-ratios, m̄ below
A loss marked `per_token` gets the margin of each answer's log-ratio averaged over its tokens,
    m̄ = (log π_θ(y_w) − log π_ref(y_w)) / |y_w| − (log π_θ(y_l) − log π_ref(y_l)) / |y_l|,
so a long answer does not win or lose by its length alone.
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


@preference_losses.register("sigmoid_norm")
def sigmoid_norm(m: torch.Tensor, beta: float) -> torch.Tensor:
    return -F.logsigmoid(beta * m)  # [P], m the per-token margin m̄


sigmoid_norm.per_token = True


def dpo_loss(chosen_logp: torch.Tensor, rejected_logp: torch.Tensor, chosen_ref: torch.Tensor,
             rejected_ref: torch.Tensor, beta: float = 0.1, loss=sigmoid,
             lengths: tuple[torch.Tensor, torch.Tensor] | None = None) -> DPOOut:
    """All inputs [P] (summed log-probs per pair); `loss` one of `preference_losses`, bound to its
    options; `lengths` (the chosen and the rejected answers' tokens, [P] each): the margin m̄ of
    per-token log-ratios instead of m."""
    chosen, rejected = chosen_logp - chosen_ref, rejected_logp - rejected_ref  # [P]
    if lengths is not None:
        chosen, rejected = chosen / lengths[0].clamp(min=1), rejected / lengths[1].clamp(min=1)
    m = chosen - rejected  # [P]
    return DPOOut(loss(m, beta).mean(), m.detach().mean().item(), (m > 0).float().mean().item())
