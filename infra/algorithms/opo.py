"""OPO: On-Policy RL with Optimal reward baseline (Hao et al. 2025, eq. 5-6).

Exactly on-policy (staleness 0: every sample comes from the weights being trained), and the
baseline that minimises the gradient's variance when every token's gradient has about the same size:
    b* = Σ_i l_i r_i / Σ_i l_i           the group's rewards weighted by answer length l_i
    A_i = r_i − b*                                                              processors: [G]
    J = 1/G Σ_i Σ_t A_i · log π_θ(o_i,t)                                         trainer
No clip (on-policy the ratio is 1) and no KL term.
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("opo")
def opo() -> Sections:
    return rl("opo", "reinforce", "seq_mean_token_sum", staleness=0)
