"""RLOO: REINFORCE Leave-One-Out (Ahmadian et al. 2024, "Back to Basics", eq. 9).

Each answer's baseline is the mean reward of the other G − 1 answers to the same prompt:
    A_i = r_i − 1/(G−1) Σ_{j≠i} r_j = G/(G−1) · (r_i − mean(r))                processors: [G]
    J = 1/G Σ_i Σ_t min(r_i,t A_i, clip(r_i,t, 1−ε, 1+ε) A_i)                   trainer
The paper optimises the sequence's REINFORCE objective on-policy; with asynchronous samples undertow
keeps PPO's clipped ratio to the behaviour policy (as TRL's RLOOTrainer does), summed over the
answer's tokens as REINFORCE's log π(o_i) is. No KL term.
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("rloo")
def rloo(*, eps: float = 0.2) -> Sections:
    return rl("rloo", {"name": "ppo_clip", "eps": eps, "dual_clip": 3.0}, "seq_mean_token_sum")
