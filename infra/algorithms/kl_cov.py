"""KL-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv 2505.22617).

Instead of cutting the tokens whose log-prob and advantage covary most (Clip-Cov), hold them near the
old policy with a KL penalty, and leave every other token unclipped:
    A_i = (r_i − mean(r)) / std(r)                                                   processors: [G]
    Cov_t = (A_t − mean A) · (log π_θ(o_t) − mean log π_θ)      over the batch's trained tokens
    top = the max(1, ⌊ρ_kl · N⌋) tokens of largest Cov_t
    L_t = −ρ_t A_t + [t ∈ top] · β |log ρ_t|,   ρ_t = π_θ / π_old                    trainer
    J = −1/N Σ_t L_t
ρ_kl = 2e-4, β = 1 (verl's defaults), token mean, no KL to a reference. log ρ_t is clamped to ±10:
nothing clips this loss, and a stale token must not make it overflow.
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("kl_cov")
def kl_cov(*, kl_cov_ratio: float = 2e-4, ppo_kl_coef: float = 1.0) -> Sections:
    return rl("grpo", {"name": "kl_cov", "kl_cov_ratio": kl_cov_ratio, "ppo_kl_coef": ppo_kl_coef}, "token_mean")
