"""REINFORCE++ (Hu 2025, "REINFORCE++: An Efficient RLHF Algorithm with Robustness to Both Prompt and
Reward Models", arXiv 2501.03262).

PPO's stabilisers without a critic and without a per-prompt baseline: the KL penalty is a token
reward, the advantage a token-level return, normalised over the whole batch instead of per group.
    r_t = −β · KL_t + [t = last] · r(x, o),   KL_t = log π_old(o_t) − log π_ref(o_t)   (k1)   trainer, once per step: [B, L]
    G_t = Σ_{s≥t} γ^(s−t) r_s                                                                  [B, L]
    A_t = (G_t − mean(G)) / std(G)          mean and std over every trained token of the step  [B, L]
    J = 1 / Σ_i |o_i| · Σ_i Σ_t min(ρ_i,t A_t, clip(ρ_i,t, 1 − ε, 1 + ε) A_t),  ρ = π_θ / π_old
β = 0.01 (OpenRLHF's init_kl_coef), γ = 1, ε = 0.2. π_old is the behaviour policy the rollout recorded.
The processors' advantage is replaced by the trainer's (trainer.algorithm.advantage_transform).
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("reinforce_pp")
def reinforce_pp(*, kl_coef: float = 0.01, gamma: float = 1.0, eps: float = 0.2) -> Sections:
    return rl("dr_grpo", {"name": "ppo_clip", "eps": eps, "dual_clip": 3.0}, "token_mean", kl_coef=kl_coef,
              kl_estimator="k1", kl_placement="reward", advantage_transform={"name": "reinforce_pp", "gamma": gamma})
