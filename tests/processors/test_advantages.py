"""Each estimator and shaper against numbers worked by hand."""

import math

import numpy as np
import pytest
import torch

from undertow.processors.advantages import ADVANTAGES, ReinforceBaseline, dr_grpo, grpo, opo, rloo
from undertow.processors.shaping import clip, length_penalty, overlong, scale

R = np.array([1.0, 0.0, 0.0, 0.0])


def test_grpo_divides_by_the_unbiased_std():
    # mean 0.25; squared deviations 0.5625 + 3 * 0.0625 = 0.75; / (4 - 1) = 0.25; std 0.5
    np.testing.assert_allclose(grpo(R, eps=0.0), [1.5, -0.5, -0.5, -0.5])


def test_dr_grpo_only_subtracts_the_mean():
    np.testing.assert_allclose(dr_grpo(R), [0.75, -0.25, -0.25, -0.25])


def test_rloo_subtracts_the_mean_of_the_others():
    # 1 - mean(0, 0, 0) = 1; 0 - mean(1, 0, 0) = -1/3
    np.testing.assert_allclose(rloo(R), [1.0, -1 / 3, -1 / 3, -1 / 3])
    np.testing.assert_allclose(rloo(np.array([2.0, 4.0])), [-2.0, 2.0])


def test_reinforce_uses_the_baseline_from_before_the_group():
    est = ReinforceBaseline(momentum=0.9)
    np.testing.assert_allclose(est(np.array([1.0, 0.0])), [1.0, 0.0])  # b = 0
    # b = 0.9 * 0 + 0.1 * 0.5 = 0.05
    np.testing.assert_allclose(est(np.array([1.0, 1.0])), [0.95, 0.95])


def test_opo_subtracts_the_length_weighted_mean():
    # lengths 1, 3, 4: b* = (1·1 + 3·0 + 4·0) / 8 = 0.125
    np.testing.assert_allclose(opo(np.array([1.0, 0.0, 0.0]), np.array([1.0, 3.0, 4.0])), [0.875, -0.125, -0.125])
    # equal lengths: the plain mean, as Dr. GRPO's
    np.testing.assert_allclose(opo(R, np.full(4, 7.0)), dr_grpo(R))


def test_the_reshape_stage_hands_lengths_to_an_estimator_that_takes_them():
    from tests.helpers import exp
    from undertow.processors.reshape import Reshape

    group = [exp("g", i, 3, r, tokens=n) for i, (r, n) in enumerate([(1.0, 1), (0.0, 3), (0.0, 4)])]
    out = Reshape(advantage="opo").process_group(group)
    assert [e.advantages[0] for e in out] == pytest.approx([0.875, -0.125, -0.125])


def test_single_sample_groups_get_zero_advantage():
    for fn in (grpo, rloo):
        assert fn(np.array([3.0])).tolist() == [0.0]
    assert opo(np.array([3.0]), np.array([2.0])).tolist() == [0.0]


def test_estimators_are_registered_by_short_name():
    assert set(ADVANTAGES.names()) >= {"grpo", "dr_grpo", "rloo", "opo", "reinforce"}


def test_dapo_overlong_ramp():
    lengths = np.array([5.0, 6.0, 8.0, 10.0, 11.0])  # max 10, cache 4: the ramp starts after 6 tokens
    got = overlong(np.zeros(5), lengths, max_tokens=10, cache_tokens=4)
    np.testing.assert_allclose(got, [0.0, 0.0, -0.5, -1.0, -1.0])


@pytest.mark.parametrize("fn,kw,want", [
    (length_penalty, {"coef": 0.1}, [0.5, -1.0]),        # 1 - 0.1*5, 0 - 0.1*10
    (clip, {"low": -0.5, "high": 0.5}, [0.5, 0.0]),
    (scale, {"factor": 2.0, "shift": -1.0}, [1.0, -1.0]),
])
def test_shapers(fn, kw, want):
    np.testing.assert_allclose(fn(np.array([1.0, 0.0]), np.array([5.0, 10.0]), **kw), want)


def pass_k_by_enumeration(rewards: np.ndarray, k: int) -> np.ndarray:
    """An independent form of Chen et al. 2025's eq. 11-15: enumerate every k-subset of the group, a
    subset passing when any of its answers is correct; an answer's advantage is the mean pass of the
    subsets holding it, minus the mean pass of all subsets, over their std."""
    from itertools import combinations

    n = len(rewards)
    subsets = list(combinations(range(n), k))
    passed = {s: float(any(rewards[i] >= 0.5 for i in s)) for s in subsets}
    mean = sum(passed.values()) / len(subsets)
    std = (mean * (1 - mean)) ** 0.5
    holding = [np.mean([passed[s] for s in subsets if i in s]) for i in range(n)]
    return np.array([(h - mean) / std for h in holding])


def test_pass_k_by_hand():
    from undertow.processors.advantages import pass_k

    # N 4, c 1, k 2: R̄ = 1 − C(3,2)/C(4,2) = 1/2, σ = 1/2; A+ = (1/2)/(1/2) = 1;
    # A− = (1/2 − C(2,1)/C(3,1)) / (1/2) = (1/2 − 2/3) · 2 = −1/3
    np.testing.assert_allclose(pass_k(R, k=2), [1.0, -1 / 3, -1 / 3, -1 / 3])
    # N 4, c 2, k 2: R̄ = 1 − 1/6 = 5/6, σ = √5/6; A+ = (1/6)/σ = 1/√5; A− = (1/6 − 1/3)/σ = −1/√5
    two = np.array([1.0, 1.0, 0.0, 0.0])
    np.testing.assert_allclose(pass_k(two, k=2), [5 ** -0.5] * 2 + [-(5 ** -0.5)] * 2)
    # k = 1 is GRPO on binary rewards with the population std: (r − 1/4) / (√3/4)
    np.testing.assert_allclose(pass_k(R, k=1), (R - R.mean()) / R.std())


@pytest.mark.parametrize("rewards, k", [([1, 0, 0, 0, 0, 0], 3), ([1, 1, 0, 0, 0, 1, 0, 0], 4), ([0, 1, 0, 0, 0], 2),
                                        ([0.9, 0.2, 0.0, 0.7], 2)])
def test_pass_k_matches_the_subsets_it_averages(rewards, k):
    from undertow.processors.advantages import pass_k

    rewards = np.array(rewards, dtype=float)
    np.testing.assert_allclose(pass_k(rewards, k=k), pass_k_by_enumeration(rewards, k))


def test_pass_k_edge_cases_give_zero():
    from undertow.processors.advantages import pass_k

    assert pass_k(np.array([1.0]), k=4).tolist() == [0.0]  # singleton
    assert pass_k(np.ones(4), k=2).tolist() == [0.0] * 4  # every subset passes: σ = 0
    assert pass_k(np.zeros(4), k=2).tolist() == [0.0] * 4  # none does
    assert pass_k(np.array([1.0, 0.0, 0.0]), k=8).tolist() == [0.0] * 3  # k > N: k = N, the one subset passes
    with pytest.raises(ValueError, match="k: expected at least 1"):
        pass_k(R, k=0)


def verl_grpo_passk(scores: torch.Tensor, index: list[int], norm_adv_by_std_in_grpo: bool = True,
                    epsilon: float = 1e-6) -> torch.Tensor:
    """verl's compute_grpo_passk_outcome_advantage, per sequence (before the response mask)."""
    advantages = torch.zeros_like(scores)
    for idx in sorted(set(index)):
        members = [i for i, g in enumerate(index) if g == idx]
        rewards = scores[members]
        topk, topk_idx = torch.topk(rewards, 2)
        advantage = topk[0] - topk[1]
        if norm_adv_by_std_in_grpo:
            advantage = advantage / (torch.std(rewards) + epsilon)
        advantages[members[topk_idx[0].item()]] = advantage
    return advantages


def test_grpo_passk_by_hand_and_against_verl():
    from undertow.processors.advantages import grpo_passk

    # Best 0.9, second 0.5: only the best gets 0.4 (÷ the unbiased std with normalize).
    rewards = np.array([0.5, 0.9, 0.1, 0.5])
    np.testing.assert_allclose(grpo_passk(rewards, normalize=False), [0.0, 0.4, 0.0, 0.0])
    np.testing.assert_allclose(grpo_passk(rewards), [0.0, 0.4 / (rewards.std(ddof=1) + 1e-6), 0.0, 0.0])
    np.testing.assert_allclose(grpo_passk(np.array([1.0, 0.0, 1.0, 0.0])), 0.0)  # a tie at the top: nothing
    np.testing.assert_allclose(grpo_passk(np.array([1.0])), [0.0])
    g = np.random.default_rng(0)
    groups = [g.random(6) for _ in range(3)] + [np.array([0.0, 1.0, 0.0, 0.0])]
    index = [i for i, group in enumerate(groups) for _ in group]
    scores = torch.tensor(np.concatenate(groups), dtype=torch.float64)
    for normalize in (True, False):
        ours = np.concatenate([grpo_passk(group, normalize=normalize) for group in groups])
        np.testing.assert_allclose(ours, verl_grpo_passk(scores, index, normalize).numpy(), rtol=1e-12)


def trinity_group_advantage(rewards: list[float], baseline: str, tau: float = 1.0, shift: float = -0.1) -> torch.Tensor:
    """Trinity-RFT 0.6's OPMDGroupAdvantage ("mean", "logavgexp") and ASYMREGroupAdvantage ("asymre"),
    per experience, for a group of more than one."""
    group_rewards = torch.tensor(rewards, dtype=torch.float64)
    if baseline == "mean":
        group_baseline = torch.mean(group_rewards)
    elif baseline == "logavgexp":
        group_baseline = tau * (torch.logsumexp(group_rewards / tau, dim=-1) - torch.log(torch.tensor(len(rewards))))
    else:
        group_baseline = torch.mean(group_rewards) + shift
    return group_rewards - group_baseline


def test_opmd_and_asymre_advantages_by_hand_and_against_trinity():
    from undertow.processors.advantages import asymre, opmd

    # Rewards [1, 0]: mean 0.5; log-mean-exp (τ 1) = log((e + 1) / 2) = 0.6201; AsymRE's b = 0.4.
    two = np.array([1.0, 0.0])
    np.testing.assert_allclose(opmd(two), [0.5, -0.5])
    np.testing.assert_allclose(opmd(two, baseline="logavgexp"), [1 - math.log((math.e + 1) / 2), -math.log((math.e + 1) / 2)])
    np.testing.assert_allclose(asymre(two), [0.6, -0.4])
    g = np.random.default_rng(1)
    for rewards in (g.random(8), g.random(5) * 40, np.array([0.0, 0.0, 1.0, 1.0])):
        for tau in (0.1, 1.0, 3.0):
            # Trinity takes log(n) in float32: its baseline is off by up to τ · log(n) · 2^-24.
            np.testing.assert_allclose(opmd(rewards, baseline="logavgexp", tau=tau),
                                       trinity_group_advantage(list(rewards), "logavgexp", tau).numpy(), rtol=0,
                                       atol=tau * math.log(len(rewards)) * 2 ** -24 + 1e-12)
        np.testing.assert_allclose(opmd(rewards), trinity_group_advantage(list(rewards), "mean").numpy(), atol=1e-12)
        np.testing.assert_allclose(asymre(rewards, baseline_shift=-0.2),
                                   trinity_group_advantage(list(rewards), "asymre", shift=-0.2).numpy(), atol=1e-12)
    # r / τ = 4000 overflows e^x in float64 unless shifted first (Trinity's torch.logsumexp shifts too).
    assert np.isfinite(opmd(np.array([400.0, 0.0]), baseline="logavgexp", tau=0.1)).all()
    np.testing.assert_allclose(opmd(np.array([1.0])), [0.0])
    with pytest.raises(ValueError, match="baseline"):
        opmd(two, baseline="max")


def verl_remax(token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor, response_mask: torch.Tensor):
    """verl's compute_remax_outcome_advantage."""
    returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    return returns - reward_baselines.unsqueeze(-1) * response_mask


def test_remax_is_the_reward_over_the_greedy_answers_and_matches_verl():
    from tests.helpers import exp
    from undertow.processors.advantages import remax
    from undertow.processors.api import Reject
    from undertow.processors.reshape import Reshape

    # Greedy answer scored 0.5: samples at 1, 0, 0.5 get +0.5, −0.5, 0.
    group = [exp("g", i, 3, r, tokens=4).model_copy(update={"metadata": {"baseline_reward": 0.5}})
             for i, r in enumerate([1.0, 0.0, 0.5])]
    out = Reshape(advantage="remax").process_group(group)
    assert [e.advantages for e in out] == [[0.5] * 4, [-0.5] * 4, [0.0] * 4]
    rewards, baselines = np.array([1.0, 0.0, 0.3, 0.9]), np.array([0.2, 0.2, 0.7, 0.7])
    token_rewards = torch.zeros(4, 5, dtype=torch.float64)
    token_rewards[:, 3] = torch.tensor(rewards)  # the outcome reward on each answer's last token
    mask = torch.tensor([[1, 1, 1, 1, 0]] * 4, dtype=torch.float64)
    verl = verl_remax(token_rewards, torch.tensor(baselines), mask)
    np.testing.assert_allclose(np.repeat(remax(rewards, baselines)[:, None], 4, axis=1), verl[:, :4].numpy())
    # A sample without the greedy answer's reward (rollout.greedy_baseline off): the group is rejected, saying why.
    lost = Reshape(advantage="remax").process_group([group[0], exp("g", 1, 3, 0.0)])
    assert isinstance(lost, Reject) and lost.reason == "no_baseline" and "rollout.greedy_baseline" in lost.detail
