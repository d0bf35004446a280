"""On-policy distillation: a teacher scores every token the student samples (Agarwal et al. 2024).

"On-Policy Distillation of Language Models" (Agarwal et al. 2024), Thinking Machines' blog (2025) and
Trinity-RFT's `on_policy_distill`: the per-token reverse KL to the teacher is the (dense) signal:
    A_t = coef · (log π_teacher(y_t) − log π_student(y_t))                    processors: distill [T]
    with reward: A_t += (r − mean r) / std r, GRPO's outcome advantage       (`with_reward`)
    L = 1 / Σ_i |o_i| · Σ_i Σ_t −min(r_t A_t, clip(r_t) A_t)                  trainer, token mean
The teacher is a model spec (`teacher: {source: hf, path: ...}`, or `init_from` a trained checkpoint)
that reads the student's tokenizer, loaded by the processors, or served by an OpenAI-compatible
server (`endpoint: {base_url, model}`; its log-probs are at temperature 1, so sample at 1).
"""

from __future__ import annotations

from typing import Any

from undertow.infra.algorithms.preset import Sections, preset, rl


@preset("on_policy_distill")
def on_policy_distill(*, teacher: dict[str, Any] | None = None, endpoint: dict[str, Any] | None = None,
                      coef: float = 1.0, with_reward: bool = False, temperature: float = 1.0) -> Sections:
    sections = rl("grpo", {"name": "ppo_clip", "eps": 0.2}, "token_mean")
    distill = {"name": "distill", "teacher": teacher, "coef": coef, "temperature": temperature,
               "mode": "add" if with_reward else "replace", **({"endpoint": endpoint} if endpoint else {})}
    reshape = {"name": "reshape", "advantage": "grpo"}
    sections["processors"]["pipeline"] = ["clean", *([reshape] if with_reward else []), distill, "prioritize"]
    return sections
