"""Trainer-side advantage transforms (trainer/algorithms/advantage.py) by hand and against verl's
formulas (core_algos.py's REINFORCE++ and REINFORCE++-baseline, torch_functional's masked_whiten)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from undertow.processors.advantages import dr_grpo
from undertow.trainer.algorithms import AdvantageInputs, advantage_transforms
from undertow.trainer.algorithms.advantage import discounted_returns, whiten

t = lambda v: torch.tensor(v, dtype=torch.float64)


def verl_masked_whiten(values, mask):
    """verl.utils.torch_functional.masked_whiten: unbiased masked variance, rsqrt(var + 1e-8)."""
    mean = (values * mask).sum() / mask.sum()
    var = (((values - mean) ** 2) * mask).sum() / mask.sum() * (mask.sum() / (mask.sum() - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def verl_reinforce_pp(token_level_rewards, response_mask, gamma):
    """verl's compute_reinforce_plus_plus_outcome_advantage: returns right to left, the running return
    reset after each masked position, then masked_whiten · mask."""
    returns = torch.zeros_like(token_level_rewards)
    running = 0
    for i in reversed(range(token_level_rewards.shape[1])):
        running = token_level_rewards[:, i] + gamma * running
        returns[:, i] = running
        running = running * response_mask[:, i]
    return verl_masked_whiten(returns, response_mask) * response_mask


def inputs(mask, adv=None, rewards=None, kl=None) -> AdvantageInputs:
    mask = t(mask)
    zeros = torch.zeros_like(mask)
    return AdvantageInputs(mask, t(adv) if adv is not None else zeros,
                           t(rewards) if rewards is not None else torch.zeros(mask.shape[0], dtype=torch.float64),
                           t(kl) if kl is not None else zeros)


def test_whiten_by_hand_and_its_edges():
    # tokens 1, 2, 3 (the 4th masked): mean 2, unbiased variance (1 + 0 + 1) / 2 = 1
    got = whiten(t([[1.0, 2.0], [3.0, 99.0]]), t([[1, 1], [1, 0]]))
    assert got.flatten().tolist() == pytest.approx([-1.0, 0.0, 1.0, 0.0], abs=1e-7)
    assert whiten(t([[5.0, 5.0]]), t([[1, 1]])).tolist() == [[0.0, 0.0]]  # zero variance: 0, finite
    assert whiten(t([[5.0, 7.0]]), t([[1, 0]])).tolist() == [[0.0, 0.0]]  # one token (verl raises)
    assert whiten(t([[5.0, 7.0]]), t([[0, 0]])).tolist() == [[0.0, 0.0]]  # nothing trained


def test_reinforce_pp_returns_by_hand():
    # row 0: β KL = [0.1, 0.2, 0.3], outcome 1 on the last token: r = [−0.1, −0.2, 0.7]
    rewards = t([[-0.1, -0.2, 0.7]])
    assert discounted_returns(rewards, t([[1, 1, 1]]), 1.0)[0].tolist() == pytest.approx([0.4, 0.5, 0.7])
    # γ = 0.5: G_2 = 0.7, G_1 = −0.2 + 0.35 = 0.15, G_0 = −0.1 + 0.075 = −0.025
    assert discounted_returns(rewards, t([[1, 1, 1]]), 0.5)[0].tolist() == pytest.approx([-0.025, 0.15, 0.7])
    # a tool's token in the middle (masked) carries the return through: G = [1, 0 (masked), 1];
    # verl resets there and gives token 0 a return of 0
    assert discounted_returns(t([[0.0, 0.0, 1.0]]), t([[1, 0, 1]]), 1.0).tolist() == [[1.0, 0.0, 1.0]]
    assert verl_reinforce_pp(t([[0.0, 0.0, 1.0]]), t([[1, 0, 1]]), 1.0)[0, 0] < 0  # its 0, whitened


def test_reinforce_pp_puts_the_outcome_on_the_last_trained_token_and_whitens_over_the_batch():
    # a third row with nothing trained (fully masked) takes no outcome and no part in the statistics
    inp = inputs([[1, 1, 1], [1, 1, 0], [0, 0, 0]], rewards=[1.0, 0.0, 5.0],
                 kl=[[0.1, 0.2, 0.3], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    got = advantage_transforms.get("reinforce_pp")(inp)
    assert got[2].tolist() == [0.0, 0.0, 0.0]
    returns = torch.tensor([0.4, 0.5, 0.7, 0.0, 0.0], dtype=torch.float64)  # by hand, above
    std = math.sqrt(((returns - returns.mean()) ** 2).sum().item() / 4)  # unbiased over the 5 trained tokens
    want = ((returns - returns.mean()) / std).tolist()
    assert got[0].tolist() + got[1, :2].tolist() == pytest.approx(want, rel=1e-6)
    assert got[1, 2].item() == 0.0


def batch_of(seed: int, rows: int = 5, width: int = 6):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, width + 1, (rows,), generator=g)
    mask = (torch.arange(width)[None, :] < lengths[:, None]).double()  # [B, L], no holes (verl's layout)
    kl = torch.rand(rows, width, generator=g, dtype=torch.float64) * 0.05 * mask
    rewards = torch.randint(0, 2, (rows,), generator=g).double()
    return mask, kl, rewards, lengths


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_matches_verl(seed, gamma):
    mask, kl, rewards, lengths = batch_of(seed)
    token_level_rewards = -kl.clone()  # verl: token_level_scores (outcome on the last token) − β KL
    token_level_rewards[torch.arange(len(lengths)), lengths - 1] += rewards
    want = verl_reinforce_pp(token_level_rewards, mask, gamma)
    got = advantage_transforms.get("reinforce_pp")(AdvantageInputs(mask, torch.zeros_like(mask), rewards, kl),
                                                    gamma=gamma)
    torch.testing.assert_close(got, want)


def verl_reinforce_pp_baseline(scores, groups, mask):
    """verl's compute_reinforce_plus_plus_baseline_outcome_advantage: score − group mean (a singleton's
    mean is 0), repeated on the response's tokens, masked_whiten · mask."""
    out = scores.clone()
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        if len(idx) > 1:
            out[idx] = scores[idx] - scores[idx].mean()
    return verl_masked_whiten(out[:, None] * mask, mask) * mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reinforce_pp_baseline_matches_verl(seed):
    mask, _, _, _ = batch_of(seed, rows=6)
    scores = torch.tensor(np.random.default_rng(seed).uniform(0, 1, 6))
    groups = [0, 0, 0, 1, 1, 1]
    # processors: dr_grpo per group; trainer: batch_whiten over the step
    adv = torch.cat([torch.tensor(dr_grpo(scores[i:i + 3].numpy())) for i in (0, 3)])[:, None] * mask
    got = advantage_transforms.get("batch_whiten")(AdvantageInputs(mask, adv, scores, torch.zeros_like(mask)))
    torch.testing.assert_close(got, verl_reinforce_pp_baseline(scores, groups, mask))


def test_batch_whiten_folds_the_kl_penalty_and_leaves_masked_rows_at_zero():
    # A = [1, 1 | −1] with β KL = [0.5, 0 | 0] → [0.5, 1, −1]: mean 1/6, whitened; the last row has no tokens
    inp = inputs([[1, 1], [1, 0], [0, 0]], adv=[[1.0, 1.0], [-1.0, 0.0], [3.0, 3.0]], kl=[[0.5, 0.0], [0.0, 0.0], [0.0, 0.0]])
    got = advantage_transforms.get("batch_whiten")(inp)
    x = torch.tensor([0.5, 1.0, -1.0], dtype=torch.float64)
    want = ((x - x.mean()) / x.std()).tolist()  # torch's std is the unbiased one, as verl's
    assert [got[0, 0].item(), got[0, 1].item(), got[1, 0].item()] == pytest.approx(want, rel=1e-6)
    assert got[2].tolist() == [0.0, 0.0] and got[1, 1].item() == 0.0


def test_gamma_out_of_range_is_refused():
    with pytest.raises(ValueError, match="gamma"):
        advantage_transforms.get("reinforce_pp")(inputs([[1]]), gamma=1.5)
