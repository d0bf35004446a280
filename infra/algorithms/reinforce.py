"""REINFORCE with a baseline (Williams 1992): the plain policy gradient.

    b ← m · b + (1 − m) · mean(r)              a running baseline over past groups (momentum m)
    A_i = r_i − b                                                               processors: [G]
    J = 1/B Σ_i Σ_t w_i,t · A_i · log π_θ(o_i,t)                                trainer
w_i,t = π_θ/π_behaviour (no gradient) corrects asynchronous samples; its log is clamped to ±10, so
one stale token can scale its loss by at most e^10. No KL term.
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("reinforce")
def reinforce(*, momentum: float = 0.9) -> Sections:
    return rl({"name": "reinforce", "momentum": momentum}, "reinforce", "seq_mean_token_sum")
