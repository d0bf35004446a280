"""Group-relative advantage estimators: one scalar per sequence from the rewards of its group.

Each takes the group's rewards (shape [G]) and returns advantages (shape [G]); one that also
declares `lengths` gets the answers' token counts ([G]). The reshape stage repeats a sequence's
advantage once per response token.
"""

from __future__ import annotations

import numpy as np

from undertow.kernel.registry import Registry

ADVANTAGES: Registry = Registry("advantage estimator")


def advantage(name: str):
    """Decorator registering an estimator (a function, or a class whose instances are called)."""
    return ADVANTAGES.register(name)


@advantage("grpo")
def grpo(rewards: np.ndarray, *, eps: float = 1e-6) -> np.ndarray:
    """(r - mean) / (std + eps). Shao et al. 2024 (DeepSeekMath) eq. in §4.1.2; the std is the
    unbiased sample std, as in verl's compute_grpo_outcome_advantage and TRL's GRPOTrainer."""
    if len(rewards) < 2:
        return np.zeros_like(rewards)
    return (rewards - rewards.mean()) / (rewards.std(ddof=1) + eps)


@advantage("dr_grpo")
def dr_grpo(rewards: np.ndarray) -> np.ndarray:
    """r - mean: Dr. GRPO drops the std division, which biases toward easy/hard prompts
    (Liu et al. 2025, "Understanding R1-Zero-Like Training", §3.1)."""
    return rewards - rewards.mean()


@advantage("rloo")
def rloo(rewards: np.ndarray) -> np.ndarray:
    """r_i - mean of the other G-1 rewards = G/(G-1) (r_i - mean) (Ahmadian et al. 2024, eq. 9)."""
    g = len(rewards)
    if g < 2:
        return np.zeros_like(rewards)
    return (rewards * g - rewards.sum()) / (g - 1)


@advantage("opo")
def opo(rewards: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """r - b* with b* = Σ l_i r_i / Σ l_i, the length-weighted mean: OPO's optimal baseline (Hao et al.
    2025, eq. 6), the variance-minimising one when every token's gradient has about the same norm."""
    if len(rewards) < 2:
        return np.zeros_like(rewards)
    weights = np.maximum(lengths, 1)  # an empty answer still counts once
    return rewards - (weights * rewards).sum() / weights.sum()


@advantage("reinforce")
class ReinforceBaseline:
    """r - b, with b a running mean of past group means (Williams 1992's baseline, as an EMA).

    The advantage uses the baseline from before this group; then b <- m*b + (1-m)*mean(r).
    """

    def __init__(self, *, momentum: float = 0.9, initial: float = 0.0):
        self.momentum, self.baseline = momentum, initial

    def __call__(self, rewards: np.ndarray) -> np.ndarray:
        out = rewards - self.baseline
        self.baseline = self.momentum * self.baseline + (1 - self.momentum) * float(rewards.mean())
        return out
