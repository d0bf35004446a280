"""GRPO: Group Relative Policy Optimization (Shao et al. 2024, "DeepSeekMath", §4.1.2, eq. 3).

For a prompt q, G answers o_1..o_G with rewards r_1..r_G (one group on the raw topic):
    A_i = (r_i − mean(r)) / (std(r) + ε)                                        processors: [G]
    r_i,t = π_θ(o_i,t) / π_old(o_i,t)                                           trainer: [B, T]
    J = 1/G Σ_i 1/|o_i| Σ_t [ min(r_i,t A_i, clip(r_i,t, 1−ε, 1+ε) A_i) − β D_KL(π_θ ‖ π_ref) ]
with D_KL by the k3 estimator (Schulman 2020), per token. The paper's β = 0.04, ε = 0.2; undertow
adds PPO's dual clip (c = 3, Ye et al. 2020, as verl does by default) so that a stale sample with a
huge ratio and a negative advantage cannot dominate a step. π_old is the behaviour policy the
rollout recorded (asynchronous: up to max_staleness versions old). A singleton group has A = 0.
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("grpo")
def grpo(*, eps: float = 0.2, kl_coef: float = 0.04) -> Sections:
    return rl("grpo", {"name": "ppo_clip", "eps": eps, "dual_clip": 3.0}, "seq_mean_token_mean", kl_coef=kl_coef)
