"""Trajectories of one task -> Experience records (pure)."""

from __future__ import annotations

import time

from undertow.schemas import Experience, Task

from undertow.rollout.rewards.registry import total
from undertow.rollout.workflows.base import Trajectory


def experience_id(group_id: str, sample_index: int) -> str:
    """Deterministic: a redelivered task produces the same ids, so the trainer can drop duplicates."""
    return f"{group_id}/{sample_index}"


def to_experiences(task: Task, trajectories: list[Trajectory], *, policy_version: int, worker: str,
                   generated_at: float | None = None, tokenizer: str | None = None) -> list[Experience]:
    """One Experience per trajectory; group id = task id, reward = sum of the components; stamped with
    the engine's `tokenizer` fingerprint, which the trainer checks against its own. Each token's policy
    version is the trajectory's `versions` (an engine that swaps weights mid-sequence says which
    tokens each version sampled), else `policy_version` for all; the record's policy_version is the
    oldest token's (schemas/experience.py)."""
    stamp = {"tokenizer": tokenizer} if tokenizer else {}
    if len(trajectories) != task.group_size:
        raise ValueError(f"task {task.task_id}: workflow returned {len(trajectories)} samples, "
                         f"group_size is {task.group_size}")
    now = time.time() if generated_at is None else generated_at
    versions = [t.versions or [policy_version] * len(t.response_tokens) for t in trajectories]
    return [
        Experience(
            experience_id=experience_id(task.task_id, i), task_id=task.task_id, group_id=task.task_id,
            group_size=task.group_size, sample_index=i, prompt_text=t.prompt_text, prompt_tokens=t.prompt_tokens,
            response_text=t.response_text, response_tokens=t.response_tokens, behaviour_logprobs=t.logprobs,
            loss_mask=t.loss_mask, reward=total(t.reward_components), reward_components=t.reward_components,
            policy_version=min(versions[i], default=policy_version), token_versions=versions[i],
            finish_reason=t.finish_reason,
            timestamps={"created": task.created_at, "generated": now},
            metadata={"taskset": task.taskset, "worker": worker, **stamp, **t.metadata},
        )
        for i, t in enumerate(trajectories)
    ]
