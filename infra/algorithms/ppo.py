"""PPO with a learned critic: GAE advantages, the clipped surrogate and a clipped value loss.

Schulman et al. 2017, "Proximal Policy Optimization Algorithms", eq. 7 and 9; the advantages by GAE
(Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage Estimation",
eq. 16); the KL to the reference as a token reward, as RLHF applies it (Ouyang et al. 2022,
"Training language models to follow instructions with human feedback", eq. 2).

    r_t = −β · KL_t + [t = last] · r(x, o),   KL_t = log π_old(o_t) − log π_ref(o_t)   (k1)    trainer, once per step: [B, L]
    V_t = V_φ_old(s_t)                         the critic's values, once over the whole batch          [B, L]
    δ_t = r_t + γ V_{t+1} − V_t,   A_t = Σ_l (γλ)^l δ_{t+l},   R_t = A_t + V_t,   A_t ← whiten(A_t)   [B, L]
    J^CLIP = 1 / Σ_i |o_i| · Σ_i Σ_t min(ρ_i,t A_t, clip(ρ_i,t, 1 − ε, 1 + ε) A_t),   ρ = π_θ / π_old     policy engine
    L^V    = 1 / Σ_i |o_i| · Σ_i Σ_t ½ max((V_φ − R_t)², (clip(V_φ, V_t − ε_v, V_t + ε_v) − R_t)²)     critic engine
Both engines step in every update (the same mini-batches and epochs). β = 0.02 (InstructGPT's), γ = 1,
λ = 0.95, ε = ε_v = 0.2 (PPO2's cliprange for both). π_old is the behaviour policy the rollout recorded.
The critic is a separate model (trainer/critic.py): the policy's weights, LoRA and publishing are
untouched. The processors' reshape still shapes and checks the rewards, but its advantage is not
used: `gae` reads the rewards and the critic's values only.
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("ppo")
def ppo(*, kl_coef: float = 0.02, gamma: float = 1.0, lam: float = 0.95, eps: float = 0.2, value_clip: float = 0.2,
        critic_lr: float = 1e-4) -> Sections:
    sections = rl("dr_grpo", {"name": "ppo_clip", "eps": eps, "dual_clip": 3.0}, "token_mean", kl_coef=kl_coef,
                  kl_estimator="k1", kl_placement="reward",
                  advantage_transform={"name": "gae", "gamma": gamma, "lam": lam})
    sections["trainer"]["critic"] = {"lr": critic_lr, "value_clip": value_clip}
    return sections
