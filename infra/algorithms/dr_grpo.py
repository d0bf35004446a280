"""Dr. GRPO: GRPO Done Right (Liu et al. 2025, "Understanding R1-Zero-Like Training", §3.1, eq. 3).

GRPO's two normalisations bias it: dividing by std(r) favours prompts that are too easy or too
hard, and 1/|o_i| favours long wrong answers. Both go:
    A_i = r_i − mean(r)                                                        processors: [G]
    J = 1/(G · L) Σ_i Σ_t min(r_i,t A_i, clip(r_i,t, 1−ε, 1+ε) A_i)            L: a constant (max_tokens)
and no KL term.
"""

from __future__ import annotations

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("dr_grpo")
def dr_grpo(*, eps: float = 0.2, max_tokens: int = 256) -> Sections:
    return rl("dr_grpo", {"name": "ppo_clip", "eps": eps, "dual_clip": 3.0},
              {"name": "seq_mean_token_sum_norm", "max_tokens": max_tokens})
