"""PPO with a critic: Generalized Advantage Estimation (Schulman et al. 2016, "High-Dimensional
Continuous Control Using Generalized Advantage Estimation", eq. 11-16) from a learned value V(s_t),
and PPO2's clipped value loss (the OpenAI baselines ppo2 / verl's compute_value_loss).

Once per step, over the whole batch (the objective's `prepare`, every rank the same), response-aligned:
    r_t = −β · KL_t + [t = last trained] · r(x, o)           token rewards (KL only in the reward)   [B, L]
    V_t = V_φ_old(s_t)                                       the critic before the step's updates    [B, L]
    δ_t = r_t + γ V_{t+1} − V_t,   V after the last trained token = 0                               (eq. 11)
    A_t = Σ_l (γλ)^l δ_{t+l} = δ_t + γλ A_{t+1}                                                      (eq. 16)
    R_t = A_t + V_t                                          the critic's target, before whitening
    A_t ← whiten(A_t)                                        over every trained token of the step (optional)
λ = 1 gives the Monte-Carlo return minus V (G_t − V_t), λ = 0 the one-step TD error δ_t.
An untrained token inside a response (a tool's output) is skipped: "t + 1" is the next trained token,
as verl's compute_gae_advantage_return does (it neither discounts nor rewards there).

In every update, on the critic's own engine (its own optimizer), beside the policy's:
    L^V_t = ½ · max((V_φ(s_t) − R_t)², (clip(V_φ(s_t), V_t − ε_v, V_t + ε_v) − R_t)²)             [B, L]
aggregated like the policy loss (same aggregation, same step totals), so it is exact under
micro-batches and ranks too.
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .advantage import outcome_rewards, whiten
from .base import AdvantageInputs, AdvantageOut, LossOut, advantage_transforms, masked, masked_mean


def gae_returns(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
                lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(A, R): GAE's advantages and returns R = A + V, right to left over each row's trained tokens;
    all [B, L], 0 where mask is 0."""
    advantages = torch.zeros_like(rewards)
    next_value = torch.zeros_like(rewards[:, 0])  # [B]  V_{t+1}; 0 past the last trained token
    running = torch.zeros_like(rewards[:, 0])  # [B]  A_{t+1}
    on = mask > 0
    for t in reversed(range(rewards.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]  # [B]  δ_t
        running = torch.where(on[:, t], delta + gamma * lam * running, running)
        next_value = torch.where(on[:, t], values[:, t], next_value)
        advantages[:, t] = running
    return masked(advantages, mask), masked(advantages + values, mask)


@advantage_transforms.register("gae")
def gae(inp: AdvantageInputs, *, gamma: float = 1.0, lam: float = 0.95, normalize: bool = True) -> AdvantageOut:
    """GAE(γ, λ) from the critic's values, with the outcome reward on the last trained token and the
    KL penalty (with `kl.placement: reward`) on every one; `normalize` whitens the advantages over the
    step's trained tokens (verl always does). The processors' advantages are ignored. γ = 1 and
    λ = 0.95 are OpenRLHF's PPO defaults (verl's: λ = 1)."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma: expected a discount in [0, 1], got {gamma}")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam: expected λ in [0, 1], got {lam}")
    if inp.values is None:
        raise ValueError("advantage_transform gae: needs the critic's values; set trainer.critic")
    token_rewards = outcome_rewards(inp.rewards, inp.mask) - inp.kl_penalty  # [B, L]
    advantages, returns = gae_returns(token_rewards, inp.values, inp.mask, gamma, lam)  # [B, L], [B, L]
    return AdvantageOut(whiten(advantages, inp.mask) if normalize else advantages, returns)


gae.needs_values = True  # the step builds and trains a critic for it (trainer.critic)


def clipped_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor,
                       clip: float | None) -> LossOut:
    """PPO2's value loss per token, ½ max((V − R)², (clip(V, V_old ± ε_v) − R)²) [B, T] (None: the plain
    ½ (V − R)²), and the fraction of trained tokens where the clipped branch was the larger. V is
    clamped into [V_old − ε_v, V_old + ε_v] itself, as verl does: V_old + clamp(V − V_old) is V only up
    to rounding, and a branch larger by 1e-18 counted as clipped (8% of tokens inside the clip)."""
    unclipped = (values - returns) ** 2  # [B, T]
    if clip is None:
        token_loss, bit = 0.5 * unclipped, torch.zeros_like(mask, dtype=torch.bool)
    else:
        clipped = (torch.clamp(values, old_values - clip, old_values + clip) - returns) ** 2  # [B, T]
        token_loss, bit = 0.5 * torch.maximum(unclipped, clipped), clipped > unclipped
    metrics = {"vf_clip_fraction": masked_mean(bit.to(values.dtype), mask).item(),
               "value_pred_mean": masked_mean(values.detach(), mask).item()}
    return LossOut(masked(token_loss, mask), metrics)


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float | None:
    """1 − Var[R − V] / Var[R] over the trained tokens (population variances, as CleanRL's PPO logs it):
    1 when V predicts R exactly, 0 when no better than R's mean, negative when worse. None when R
    does not vary (fewer than 2 tokens, or all equal)."""
    n = mask.sum()
    if n < 2:
        return None
    var = lambda x: (masked(x - masked(x, mask).sum() / n, mask) ** 2).sum() / n
    var_returns = var(returns)
    if var_returns <= 0:
        return None
    return float(1 - var(returns - values) / var_returns)
