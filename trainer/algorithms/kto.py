"""KTO: Kahneman-Tversky Optimization (Ethayarajh et al. 2024, eq. 8; TRL's KTOTrainer, loss_type "kto").

Each example is one response y to a prompt x, labelled desirable (D) or undesirable (U); from a
preference pair, the chosen answer is desirable and the rejected one undesirable (what TRL does
with paired data). With the implied reward r_θ(x, y) = log π_θ(y|x) − log π_ref(y|x) (summed
log-probs) and the reference point

    z0 = max(0, KL estimate) = max(0, mean_i [log π_θ(y'_i|x_i) − log π_ref(y'_i|x_i)])   (detached)

estimated on mismatched examples (x_i with the response y'_i = y_{i−1} of the example before it,
TRL's rotation), the value of an example is

    v(x, y) = λ_D σ(β (r_θ(x, y) − z0))   if y is desirable
              λ_U σ(β (z0 − r_θ(x, y)))   if y is undesirable

and the loss is L_KTO = E_{x,y}[λ_y − v(x, y)] = mean over examples of λ_y (1 − σ(·)).
z0 carries no gradient (the paper: "for the purpose of stable optimization"; TRL computes it
under no_grad), so the loss pushes desirable rewards above z0 and undesirable ones below it.
"""

from __future__ import annotations

from dataclasses import dataclass

from undertow.kernel.lazy import torch


@dataclass
class KTOOut:
    losses: torch.Tensor  # [D + U] per-example λ_y (1 − σ(·)), desirable first
    z0: float  # the reference point used
    reward_margin: float  # mean over pairs of r(y_w) − r(y_l) (when given as pairs), else 0
    accuracy: float  # fraction of pairs with r(y_w) > r(y_l)


def rotated(n: int) -> list[int]:
    """Which example's response each of n examples is paired with for the KL estimate: i ← i−1 (mod n),
    TRL's `_get_kl_dataset` rotation. With one example that is the example itself."""
    return [(i - 1) % n for i in range(n)]


def reference_point(policy_kl_logp: torch.Tensor, ref_kl_logp: torch.Tensor) -> torch.Tensor:
    """z0 = max(0, mean(log π_θ(y'|x) − log π_ref(y'|x))), detached.  Inputs [N] summed log-probs."""
    return (policy_kl_logp - ref_kl_logp).detach().mean().clamp(min=0)  # scalar


def kto_loss(desirable_logratio: torch.Tensor, undesirable_logratio: torch.Tensor, z0: torch.Tensor | float, *,
             beta: float = 0.1, desirable_weight: float = 1.0, undesirable_weight: float = 1.0) -> KTOOut:
    """Per-example KTO losses. `desirable_logratio` [D], `undesirable_logratio` [U]: r_θ = log π_θ − log π_ref
    (summed). When D == U the two are read as pairs (row i of each) for the margin and accuracy metrics."""
    z0 = torch.as_tensor(z0, dtype=desirable_logratio.dtype, device=desirable_logratio.device).detach()
    # 1 − σ(a) = σ(−a): finite and bounded in [0, λ] however large |r| gets.
    desirable = desirable_weight * torch.sigmoid(-beta * (desirable_logratio - z0))  # [D]
    undesirable = undesirable_weight * torch.sigmoid(-beta * (z0 - undesirable_logratio))  # [U]
    margin, accuracy = 0.0, 0.0
    if desirable_logratio.shape == undesirable_logratio.shape and desirable_logratio.numel():
        m = (desirable_logratio - undesirable_logratio).detach()  # [P]
        margin, accuracy = m.mean().item(), (m > 0).float().mean().item()
    return KTOOut(torch.cat([desirable, undesirable]), float(z0), margin, accuracy)
