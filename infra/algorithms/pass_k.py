"""Pass@k Training (Chen et al. 2025, "Pass@k Training for Adaptively Balancing Exploration and
Exploitation of Large Reasoning Models", arXiv 2508.10751, eq. 11-15), analytic advantage.

Reward a group by pass@k (does any of k answers pass?) instead of pass@1, computed in closed form over
all k-subsets of the group's N answers, c of them correct:
    R̄ = 1 − C(N−c, k) / C(N, k),   σ = sqrt(R̄ (1 − R̄))                            processors: [G]
    A_correct = (1 − R̄) / σ
    A_wrong = (1 − R̄ − C(N−c−1, k−1) / C(N−1, k−1)) / σ
    J = 1/G Σ_i 1/|o_i| Σ_t min(ρ_i,t A_i, clip(ρ_i,t, 1 − ε, 1 + ε) A_i)           trainer
A wrong answer in a group that mostly passes is barely penalised, which keeps the policy exploring;
k = 1 is GRPO on binary rewards. A reward ≥ threshold counts as correct. No KL term.
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("pass_k")
def pass_k(*, k: int = 4, eps: float = 0.2) -> Sections:
    return rl({"name": "pass_k", "k": k}, {"name": "ppo_clip", "eps": eps, "dual_clip": 3.0}, "seq_mean_token_mean")
