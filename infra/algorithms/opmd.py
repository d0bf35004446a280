"""OPMD: Trinity-RFT's group mirror descent (its `opmd` algorithm).

The group's baseline is the mean reward, or the soft maximum of the KL-regularised optimum:
    A_i = r_i − mean(r)   or   r_i − τ log mean_j e^(r_j/τ)                     processors: [G]
    L = 1 / Σ_i |o_i| · Σ_i Σ_t −A_i log π_θ(o_i,t) / (1 + τ)                trainer, token mean
One mirror-descent step on E[r] − τ KL(π ‖ π_t) around the current policy; no clip, no importance
weight. Trinity adds a k2 KL loss to a reference; `kl_coef` sets it (0: none).
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("opmd")
def opmd(*, tau: float = 1.0, baseline: str = "mean", kl_coef: float = 0.0) -> Sections:
    return rl({"name": "opmd", "baseline": baseline, "tau": tau}, {"name": "opmd", "tau": tau}, "token_mean",
              kl_coef=kl_coef, kl_estimator="k2")
