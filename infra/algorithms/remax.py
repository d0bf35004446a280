"""ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method for
Aligning Large Language Models", arXiv 2310.10505, Algorithm 1).

REINFORCE with the reward of the policy's own greedy answer as the baseline: no critic, no group
statistics. The rollout answers each task greedily once more, scores that answer and never trains it:
    A_i = r(x, y_i) − r(x, ȳ),   ȳ = the greedy answer to x                       processors: [G]
    L = 1 / Σ_i |o_i| · Σ_i Σ_t −A_i log π_θ(o_i,t)                              trainer, on-policy
As verl's `remax` estimator (with its actor's loss: PPO's clip, ratio 1 on-policy).
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("remax")
def remax(*, eps: float = 0.2) -> Sections:
    sections = rl("remax", {"name": "ppo_clip", "eps": eps}, "token_mean")
    sections["rollout"] = {"greedy_baseline": True}
    return sections
