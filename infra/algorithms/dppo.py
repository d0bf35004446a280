"""DPPO: Divergence Proximal Policy Optimization ("Rethinking the Trust Region in LLM Reinforcement
Learning", arXiv 2602.04879; verl's dppo_tv / dppo_kl and its examples/dppo_trainer recipe).

PPO's trust region is a box on the token ratio; DPPO's is a bound on how far the token's probability
itself moved, measured against the rollout policy (undertow's behaviour log-probs):
    A_i = r_i − mean(r)                                                         processors: [G]
    p = π_θ(o_t), q = π_old(o_t),  D = p − q (TV) or q log(q/p) + (1−q) log((1−q)/(1−p)) (KL)
    valid_t: A > 0 and (D ≤ δ or p ≤ q), or A < 0 and (D ≥ −δ (TV) / D ≤ δ or p ≥ q (KL))
    J = 1/(G · L) Σ_i Σ_t A_i · sg[min(ρ_t, c)] · log π_θ(o_t) · sg[valid_t]            trainer
δ = 0.15 for TV, 0.05 for KL, c = 20; Dr. GRPO's advantage and constant normaliser L (max_tokens), as
the recipe recommends; no KL to a reference.
"""

from __future__ import annotations

from typing import Literal

from undertow.infra.algorithms.preset import Sections, preset, rl

DEFAULT_DELTA = {"tv": 0.15, "kl": 0.05}  # verl's examples/dppo_trainer recipe


@preset("dppo")
def dppo(*, divergence: Literal["tv", "kl"] = "tv", delta: float | None = None, max_tokens: int = 256) -> Sections:
    d = DEFAULT_DELTA[divergence] if delta is None else delta
    return rl("dr_grpo", {"name": f"dppo_{divergence}", "delta_low": d, "delta_high": d},
              {"name": "seq_mean_token_sum_norm", "max_tokens": max_tokens})
