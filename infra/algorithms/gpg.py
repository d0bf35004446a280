"""GPG: Group Policy Gradient (Chu et al. 2025, "GPG: A Simple and Strong Reinforcement Learning
Baseline for Model Reasoning", eq. 8-10).

No surrogate, no clip, no KL, no critic: the policy gradient with a group baseline.
    A_i = r_i − mean(r)                                                         processors: [G]
    J = α / Σ_i |o_i| · Σ_i Σ_t A_i · log π_θ(o_i,t),  α = B / (B − M)
α corrects for the M samples whose groups carry no signal (all rewards equal, A = 0): dropping
those groups (dynamic sampling) and averaging over the rest is the same correction. Asynchronous
samples are weighted by π_θ/π_behaviour (no gradient), which is 1 on-policy.

`verl_alpha: true` computes it as verl does instead: every group kept, and each step's advantages
scaled by α = B / (the sequences with a non-zero reward) (the `gpg` advantage transform).
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("gpg")
def gpg(*, verl_alpha: bool = False) -> Sections:
    if verl_alpha:
        return rl("dr_grpo", "reinforce", "token_mean", advantage_transform="gpg")
    return rl("dr_grpo", "reinforce", "token_mean", dynamic_sampling=True)
