"""Reward functions: `fn(response, task, **kwargs) -> dict[str, float]`, chosen by config.

An Experience's `reward` is the sum of the components a reward returns (see `total`).
"""

from undertow.rollout.rewards.registry import RewardFn, build_reward, reward, rewards, total
from undertow.rollout.rewards import builtins as _builtins  # noqa: F401  (fills the registry)
from undertow.rollout.rewards import countdown as _countdown  # noqa: F401
from undertow.rollout.rewards import models as _models  # noqa: F401

__all__ = ["RewardFn", "build_reward", "reward", "rewards", "total"]
