"""GMPO: Geometric-Mean Policy Optimization (Zhao et al. 2025, eq. 6-7).

GRPO averages token ratios arithmetically, so one outlier token can swing the update; GMPO takes
their geometric mean and clips each token's ratio in log space, with a wider range:
    A_i = (r_i − mean(r)) / std(r)                                              processors: [G]
    J = 1/G Σ_i sgn(A_i) · Π_t min(r_i,t |A_i|, clip(r_i,t, e^−ε_low, e^ε_high) |A_i|)^(1/|o_i|)
the paper's ε_low = ε_high = 0.4; no KL term.
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("gmpo")
def gmpo(*, eps_low: float = 0.4, eps_high: float = 0.4) -> Sections:
    return rl("grpo", {"name": "gmpo", "eps_low": eps_low, "eps_high": eps_high}, "seq_mean_token_mean")
