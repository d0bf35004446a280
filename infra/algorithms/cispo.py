"""CISPO: Clipped IS-weight Policy Optimization (MiniMax-M1, 2025, eq. 4).

Clip the importance weight, not the update, so that every token keeps its gradient (PPO's clip
zeroes it for the rare tokens that matter most in long reasoning):
    A_i = (r_i − mean(r)) / std(r)                                             processors: [G]
    J = 1 / Σ_i |o_i| · Σ_i Σ_t sg[clip(r_i,t, 1 − ε_low, 1 + ε_high)] · A_i · log π_θ(o_i,t)
M1 leaves the lower bound open (ε_low large) and tunes ε_high; no KL.
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("cispo")
def cispo(*, eps_high: float = 0.28) -> Sections:
    return rl("grpo", {"name": "cispo", "eps_high": eps_high}, "token_mean")
