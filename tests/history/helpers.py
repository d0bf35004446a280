"""A small recorded run: prompt groups with known rewards, in the tiny model's tokens."""

from __future__ import annotations

from undertow.kernel.models import ModelSpec, build_tokenizer
from undertow.schemas import Experience, MetricEvent

SPEC = ModelSpec()
REWARDS = [1.0, 0.0, 0.5, 0.25]  # per sample index: best is 0, worst is 1


def make_group(g: int, *, version: int = 0) -> list[Experience]:
    """Group `g-<g>`: prompt "g+g=", sample i answers 2g+i with reward REWARDS[i]."""
    tok = build_tokenizer(SPEC)
    prompt_text = f"{g}+{g}="
    prompt = tok(prompt_text)["input_ids"]
    out = []
    for i, reward in enumerate(REWARDS):
        text = str(2 * g + i)
        response = tok(text)["input_ids"] + [tok.eos_token_id]
        out.append(Experience(
            experience_id=f"g-{g}/{i}", task_id=f"g-{g}", group_id=f"g-{g}", group_size=len(REWARDS),
            sample_index=i, prompt_text=prompt_text, prompt_tokens=prompt, response_text=text,
            response_tokens=response, behaviour_logprobs=[-1.0 - i] * len(response), reward=reward,
            reward_components={"correct": float(i == 0)}, advantages=[reward - 0.4375] * len(response),
            policy_version=version + g, finish_reason="stop", timestamps={"generated": 1000.0 + g}))
    return out


def recorded_run(groups: int) -> list[Experience]:
    return [e for g in range(groups) for e in make_group(g)]


def metric(step: int, loss: float) -> MetricEvent:
    return MetricEvent(component="trainer", values={"loss": loss}, step=step)
