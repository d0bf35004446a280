"""DRO: the policy gradient with a quadratic penalty on the log-ratio to the step's starting policy.

Direct Reward Optimisation (Richemond et al. 2024, "Offline Regularised Reinforcement Learning for
Large Language Models Alignment") fits a policy and a value to single rated answers with
    L(θ, V) = ½ E[(r(x, y) − V(x) − τ log π_θ(y|x)/π_ref(y|x))²],
whose policy gradient is −τ (A − τ log π_θ/π_ref) ∇ log π_θ, with A = r − V. verl's `dro` policy
loss keeps that gradient per token, divided by τ (β = τ), with the policy the step started from as
the reference and the advantage from the estimator the run chose:
    L_t = −( A_t log π_θ(y_t) − ½ β (log π_θ(y_t) − log π_old(y_t))² )
    ∇L_t = −( A_t − β (log π_θ − log π_old) ) ∇ log π_θ
π_old is `proximal_logp`, the trainer's own log-probs at the step's start (verl's old_log_prob):
the penalty is zero at the first update of a step and pulls back as later mini-batches and epochs
move away from it. There is no importance weight: it learns from the samples as if on-policy.
The log-ratio is clamped to ±20 (as every ratio here) so that a masked −inf log-prob stays finite.
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import MAX_LOG_RATIO, LossOut, PolicyInputs, masked, policy_losses, ratio_metrics


@policy_losses.register("dro")
def dro(inp: PolicyInputs, logp: torch.Tensor, *, beta: float = 1.0) -> LossOut:
    """verl's DRO loss; `beta` (verl's policy_loss.dro_beta) > 0 weighs the quadratic penalty."""
    if beta <= 0:
        raise ValueError(f"beta: expected a penalty weight > 0, got {beta}")
    log_ratio = (logp - inp.proximal_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)  # [B, T]
    loss = masked(-(inp.advantages * logp - 0.5 * beta * log_ratio ** 2), inp.mask)  # [B, T]
    r = torch.exp(log_ratio.detach())
    return LossOut(loss, ratio_metrics(r, inp.mask, torch.zeros_like(r, dtype=torch.bool)))
