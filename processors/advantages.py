"""Group-relative advantage estimators: one scalar per sequence from the rewards of its group.

Each takes the group's rewards (shape [G]) and returns advantages (shape [G]); one that also
declares `lengths` gets the answers' token counts ([G]), one that declares `baselines` the reward
of the task's greedy answer on each sample (metadata `baseline_reward`, rollout.greedy_baseline). The
reshape stage repeats a sequence's advantage once per response token.
"""

from __future__ import annotations

import math
from math import comb

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


@advantage("pass_k")
def pass_k(rewards: np.ndarray, *, k: int = 4, threshold: float = 0.5) -> np.ndarray:
    """Pass@k Training's analytic advantage (Chen et al. 2025, "Pass@k Training for Adaptively Balancing
    Exploration and Exploitation", arXiv 2508.10751, eq. 11-15): the group's reward is pass@k of its
    k-subsets, and each answer's advantage what it adds to that. A group of N with c correct
    (reward ≥ threshold):
        R̄ = 1 − C(N−c, k) / C(N, k)                           pass@k of the group        (eq. 11)
        σ = sqrt(R̄ (1 − R̄))                                                               (eq. 12)
        A_correct = (1 − R̄) / σ                                                           (eq. 14)
        A_wrong   = (1 − R̄ − C(N−c−1, k−1) / C(N−1, k−1)) / σ                             (eq. 15)
    A wrong answer is penalised only as much as it lowers the chance that a k-subset holding it
    passes. k = 1 is GRPO with binary rewards. σ = 0 (every k-subset passes, or none) gives 0; a group
    smaller than k uses k = N (then σ = 0 too), and a singleton group gets 0."""
    if k < 1:
        raise ValueError(f"k: expected at least 1 sample per subset, got {k}")
    n = len(rewards)
    if n < 2:
        return np.zeros_like(rewards)
    k = min(k, n)
    correct = rewards >= threshold  # [G]
    c = int(correct.sum())
    mean = 1.0 - comb(n - c, k) / comb(n, k)
    std = math.sqrt(mean * (1.0 - mean))
    if std < 1e-12:
        return np.zeros_like(rewards)
    wrong = (1.0 - mean - comb(n - c - 1, k - 1) / comb(n - 1, k - 1)) / std
    return np.where(correct, (1.0 - mean) / std, wrong)


@advantage("grpo_passk")
def grpo_passk(rewards: np.ndarray, *, normalize: bool = True, eps: float = 1e-6) -> np.ndarray:
    """verl's grpo_passk (from arXiv 2503.19595): only the group's best answer gets an advantage,
    r_max − r_second (what it adds to the group's best), divided by (std + eps) with `normalize` (the
    unbiased std, as verl's); every other answer gets 0. Ties: the first best, and then r_max −
    r_second = 0. Unlike `pass_k`, no threshold and no k: it credits the maximum of the whole group.
    A group of one (its other answers lost) gets 0, as in every estimator here; verl raises."""
    if len(rewards) < 2:
        return np.zeros_like(rewards)
    best = int(np.argmax(rewards))
    second = np.partition(rewards, -2)[-2]
    out = np.zeros_like(rewards, dtype=float)
    out[best] = rewards[best] - second
    if normalize:
        out[best] /= rewards.std(ddof=1) + eps
    return out


@advantage("opmd")
def opmd(rewards: np.ndarray, *, baseline: str = "mean", tau: float = 1.0) -> np.ndarray:
    """Trinity-RFT's OPMD advantage (its group mirror descent): r − b, with b the group's mean reward
    or, `baseline: logavgexp`, its soft maximum τ · log(mean(e^(r/τ))), the baseline of the
    KL-regularised optimum with temperature τ. A group of one gets 0 (Trinity: b = 0)."""
    if baseline not in ("mean", "logavgexp"):
        raise ValueError(f"baseline: expected mean or logavgexp, got {baseline!r}")
    if tau <= 0:
        raise ValueError(f"tau: expected > 0, got {tau}")
    if len(rewards) < 2:
        return np.zeros_like(rewards)
    if baseline == "mean":
        return rewards - rewards.mean()
    scaled = rewards / tau
    top = scaled.max()  # log-sum-exp, shifted so that e^x cannot overflow
    return rewards - tau * (top + np.log(np.exp(scaled - top).mean()))


@advantage("asymre")
def asymre(rewards: np.ndarray, *, baseline_shift: float = -0.1) -> np.ndarray:
    """AsymRE (asymmetric REINFORCE, Arnal et al. 2025), as Trinity-RFT computes it: r − (mean(r) + δ).
    A baseline below the mean (δ < 0, Trinity's −0.1) leans on the positive rewards, which keeps
    off-policy REINFORCE stable. A group of one gets 0 (Trinity: b = 0)."""
    if len(rewards) < 2:
        return np.zeros_like(rewards)
    return rewards - (rewards.mean() + baseline_shift)


@advantage("remax")
def remax(rewards: np.ndarray, baselines: np.ndarray) -> np.ndarray:
    """ReMax (Li et al. 2023, "ReMax: A Simple, Effective, and Efficient Reinforcement Learning Method
    for Aligning Large Language Models", arXiv 2310.10505): r − r(greedy answer), the reward of the
    task's greedy answer as the baseline (verl's compute_remax_outcome_advantage for an outcome
    reward). Needs no group: a group of one gets r − b too."""
    return rewards - baselines
