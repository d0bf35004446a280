"""Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models", arXiv 2505.22617).

The policy's entropy falls by the covariance of a token's log-prob and its advantage; a few tokens of
high covariance drive the collapse. Clip-Cov stops their gradient:
    A_i = (r_i − mean(r)) / std(r)                                                   processors: [G]
    Cov_t = (A_t − mean A) · (log π_θ(o_t) − mean log π_θ)      over the batch's trained tokens
    pick max(1, ⌊ρ_cov · N⌋) tokens at random among those with lb < Cov_t < ub that PPO's clip kept
    J = 1/N Σ_t [t not picked] · min(ρ_t A_t, clip(ρ_t, 1 − ε, 1 + ε) A_t)            trainer
ρ_cov = 2e-4, lb = 1, ub = 5, ε = 0.2 (verl's defaults), token mean, no KL. The selection is over
each micro-batch (trainer/algorithms/entropy_cov.py says why).
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("clip_cov")
def clip_cov(*, clip_cov_ratio: float = 2e-4, clip_cov_lb: float = 1.0, clip_cov_ub: float = 5.0) -> Sections:
    return rl("grpo", {"name": "clip_cov", "clip_cov_ratio": clip_cov_ratio, "clip_cov_lb": clip_cov_lb,
                       "clip_cov_ub": clip_cov_ub}, "token_mean")
