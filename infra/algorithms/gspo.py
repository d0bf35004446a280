"""GSPO: Group Sequence Policy Optimization (Zheng et al. 2025, eq. 5 and 7).

The importance ratio is the sequence's, length-normalised, and clipping acts on whole answers:
    A_i = (r_i − mean(r)) / std(r)                                             processors: [G]
    s_i = (π_θ(o_i) / π_old(o_i))^(1/|o_i|) = exp(1/|o_i| Σ_t log r_i,t)      trainer: [B]
    J = 1/G Σ_i min(s_i A_i, clip(s_i, 1 − ε_low, 1 + ε_high) A_i)
with the paper's tiny ranges (ε_low = 3e-4, ε_high = 4e-4) and no KL. log s_i is clamped to ±10
(as verl does), so one stale answer cannot make the loss overflow.
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("gspo")
def gspo(*, eps_low: float = 3e-4, eps_high: float = 4e-4) -> Sections:
    return rl("grpo", {"name": "gspo", "eps_low": eps_low, "eps_high": eps_high}, "seq_mean_token_mean")
