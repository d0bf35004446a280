"""SAPO: Soft Adaptive Policy Optimization (Gao et al. 2025, Qwen, arXiv 2511.20347, eq. 5-6, 10-12).

A sigmoid gate of the importance ratio replaces PPO's hard clip, with a temperature per sign of the
advantage, so that off-policy tokens are faded out smoothly rather than cut at 1 ± ε:
    A_i = (r_i − mean(r)) / std(r)                                                   processors: [G]
    ρ_i,t = π_θ(o_i,t) / π_old(o_i,t),   τ_i = τ_pos if A_i > 0 else τ_neg
    f(ρ) = 4/τ · σ(τ (ρ − 1))                               f'(1) = 1: PPO's gradient on-policy
    J = 1/G Σ_i 1/|o_i| Σ_t f(ρ_i,t) · A_i                                           trainer
τ_neg > τ_pos: tokens of a negative advantage lose weight faster (their gradients spread over the
whole vocabulary and destabilise more). τ_pos = 1.0, τ_neg = 1.05 (verl's and TRL's defaults); no KL.
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("sapo")
def sapo(*, tau_pos: float = 1.0, tau_neg: float = 1.05) -> Sections:
    return rl("grpo", {"name": "sapo", "tau_pos": tau_pos, "tau_neg": tau_neg}, "seq_mean_token_mean")
