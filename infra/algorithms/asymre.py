"""AsymRE: asymmetric REINFORCE (Arnal et al. 2025), as Trinity-RFT's `asymre` algorithm sets it.

A baseline a little below the group's mean reward, so that positive rewards weigh more than
negative ones, which keeps REINFORCE on off-policy samples from collapsing:
    A_i = r_i − (mean(r) + δ),   δ = −0.1                                      processors: [G]
    L = 1 / Σ_i |o_i| · Σ_i Σ_t −A_i log π_θ(o_i,t) / 2                       Trinity's opmd loss, τ = 1
No KL, no clip.
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("asymre")
def asymre(*, baseline_shift: float = -0.1) -> Sections:
    return rl({"name": "asymre", "baseline_shift": baseline_shift}, {"name": "opmd", "tau": 1.0}, "token_mean")
