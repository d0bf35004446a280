"""REINFORCE++-baseline (Hu 2025, arXiv 2501.03262), for outcome rewards with several answers
per prompt: the group's mean is the baseline, the batch's spread the scale.
    Ã_i = r_i − mean_group(r)                                                 processors: [G]
    A_i,t = (Ã_i − mean(Ã)) / std(Ã)      over every trained token of the step     trainer, once per step
    J = 1 / Σ_i |o_i| · Σ_i Σ_t min(ρ_i,t A_i,t, clip(ρ_i,t, 1 − ε, 1 + ε) A_i,t) − β · k2
Dividing by the batch's std, not the group's, keeps a near-unanimous group from being blown up
(GRPO's 1/std(r) grows without bound as a group's rewards agree). The KL is a loss term with the k2
estimator (whose gradient is the KL's), β = 1e-3, as OpenRLHF's reinforce_baseline examples
(--use_kl_loss --kl_estimator k2); checked against verl's
compute_reinforce_plus_plus_baseline_outcome_advantage. A singleton group gets Ã = 0 (verl's mean of
a singleton is 0, so its Ã is its raw reward).
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("reinforce_pp_baseline")
def reinforce_pp_baseline(*, kl_coef: float = 1e-3, eps: float = 0.2) -> Sections:
    return rl("dr_grpo", {"name": "ppo_clip", "eps": eps, "dual_clip": 3.0}, "token_mean", kl_coef=kl_coef,
              kl_estimator="k2", advantage_transform="batch_whiten")
