"""Experiences for processor tests."""

from __future__ import annotations

from schemas import Experience


def exp(group: str = "g", index: int = 0, size: int = 4, reward: float | None = 1.0, text: str = "ok",
        tokens: int = 3, finish: str = "stop", version: int = 0, task: str | None = None, **kw) -> Experience:
    return Experience(experience_id=f"{group}/{index}", task_id=task or group, group_id=group, group_size=size,
                      sample_index=index, prompt_text="p", prompt_tokens=[1, 2], response_text=text,
                      response_tokens=list(range(5, 5 + tokens)), reward=reward, policy_version=version,
                      finish_reason=finish, **kw)


def group(name: str, rewards: list[float | None], **kw) -> list[Experience]:
    return [exp(name, i, len(rewards), r, text=f"answer {i}", **kw) for i, r in enumerate(rewards)]
