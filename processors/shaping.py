"""Reward shaping applied to a group before advantages: `fn(rewards, lengths, **kwargs) -> rewards`.

`rewards` and `lengths` (response tokens) have shape [G]; applied in config order.
"""

from __future__ import annotations

import numpy as np

from undertow.kernel.registry import Registry

SHAPERS: Registry = Registry("reward shaping")


def shaper(name: str):
    return SHAPERS.register(name)


@shaper("overlong")
def overlong(rewards: np.ndarray, lengths: np.ndarray, *, max_tokens: int = 1024, cache_tokens: int = 256) -> np.ndarray:
    """DAPO soft overlong punishment (Yu et al. 2025, eq. 13): 0 up to max - cache tokens, then a
    linear ramp to -1 at `max_tokens`, and -1 beyond it."""
    start = max_tokens - cache_tokens
    penalty = np.where(lengths <= start, 0.0, (start - lengths) / cache_tokens)
    return rewards + np.where(lengths > max_tokens, -1.0, penalty)


@shaper("length_penalty")
def length_penalty(rewards: np.ndarray, lengths: np.ndarray, *, coef: float = 0.001) -> np.ndarray:
    """r - coef * n: a constant cost per response token."""
    return rewards - coef * lengths


@shaper("clip")
def clip(rewards: np.ndarray, lengths: np.ndarray, *, low: float = -1.0, high: float = 1.0) -> np.ndarray:
    return np.clip(rewards, low, high)


@shaper("scale")
def scale(rewards: np.ndarray, lengths: np.ndarray, *, factor: float = 1.0, shift: float = 0.0) -> np.ndarray:
    """factor * r + shift."""
    return factor * rewards + shift
