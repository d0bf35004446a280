"""DAPO: Decoupled clip and Dynamic sAmpling Policy Optimization (Yu et al. 2025).

GRPO's group advantage, and four changes:
    clip-higher (eq. 10):      clip(r_i,t, 1 − ε_low, 1 + ε_high), ε_low = 0.2 < ε_high = 0.28
    dynamic sampling (§3.2):   a group whose rewards are all equal is dropped (no signal)
    token-level loss (eq. 12): 1 / Σ_i |o_i| · Σ_i Σ_t (every token weighs the same)
    overlong shaping (eq. 13): answers past L_max − L_cache lose up to 1 of reward, linearly
and no KL term (β = 0). L_max and L_cache are the answer budget and its soft margin, in tokens.
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("dapo")
def dapo(*, eps_low: float = 0.2, eps_high: float = 0.28, max_tokens: int = 1024, cache_tokens: int = 256) -> Sections:
    return rl("grpo", {"name": "dapo", "eps_low": eps_low, "eps_high": eps_high, "dual_clip": 3.0}, "token_mean",
              shaping=[{"name": "overlong", "max_tokens": max_tokens, "cache_tokens": cache_tokens}],
              dynamic_sampling=True)
