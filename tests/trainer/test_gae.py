"""PPO with a critic's numbers (trainer/algorithms/gae.py): GAE by hand at its edge values (λ = 1:
Monte-Carlo return minus V; λ = 0: one-step TD error) and against verl's compute_gae_advantage_return
on the same tensors; PPO2's clipped value loss by hand and against verl's compute_value_loss;
explained variance; fully masked rows stay finite."""

from __future__ import annotations

import math

import pytest
import torch

from undertow.trainer.algorithms import (AdvantageInputs, AdvantageOut, advantage_transforms, clipped_value_loss,
                                         explained_variance)
from undertow.trainer.algorithms.gae import gae_returns

t = lambda v: torch.tensor(v, dtype=torch.float64)
gae = advantage_transforms.get("gae")


def verl_masked_whiten(values, mask):
    """verl.utils.torch_functional.masked_whiten: unbiased masked variance, rsqrt(var + 1e-8)."""
    mean = (values * mask).sum() / mask.sum()
    var = (((values - mean) ** 2) * mask).sum() / mask.sum() * (mask.sum() / (mask.sum() - 1))
    return (values - mean) * torch.rsqrt(var + 1e-8)


def verl_gae(token_level_rewards, values, response_mask, gamma, lam):
    """verl's compute_gae_advantage_return (core_algos.py), written out from its equations: right to
    left, δ = r + γ V_next − V, A = δ + γλ A_next; on an observation token (mask 0) both the next value
    and the running advantage carry through unchanged; returns = A + V; then masked_whiten(A)."""
    next_value, running, out = 0, 0, []
    for i in reversed(range(token_level_rewards.shape[1])):
        delta = token_level_rewards[:, i] + gamma * next_value - values[:, i]
        candidate = delta + gamma * lam * running
        m = response_mask[:, i]
        next_value = values[:, i] * m + (1 - m) * next_value
        running = candidate * m + (1 - m) * running
        out.append(running)
    advantages = torch.stack(out[::-1], dim=1)
    return verl_masked_whiten(advantages, response_mask), advantages + values


def verl_value_loss(vpreds, returns, values, mask, cliprange_value):
    """verl's compute_value_loss with token-mean aggregation: ½ · masked mean of the larger squared
    error, and the fraction where the clipped one is larger."""
    clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    losses1, losses2 = (vpreds - returns) ** 2, (clipped - returns) ** 2
    loss = 0.5 * (torch.max(losses1, losses2) * mask).sum() / mask.sum()
    return loss, ((losses2 > losses1).double() * mask).sum() / mask.sum()


def inputs(mask, values, rewards, kl=None) -> AdvantageInputs:
    mask = t(mask)
    return AdvantageInputs(mask, torch.zeros_like(mask), t(rewards), t(kl) if kl is not None else torch.zeros_like(mask),
                           t(values))


# One answer of 3 trained tokens, outcome reward 1 on the last, V = [0.5, 0.2, 0.4].
V, MASK = [[0.5, 0.2, 0.4]], [[1, 1, 1]]


def test_lambda_one_is_the_monte_carlo_return_minus_v():
    # γ = 1: every G_t = 1, so A = 1 − V = [0.5, 0.8, 0.6] and R = G = [1, 1, 1]
    out = gae(inputs(MASK, V, [1.0]), gamma=1.0, lam=1.0, normalize=False)
    assert isinstance(out, AdvantageOut)
    assert out.advantages[0].tolist() == pytest.approx([0.5, 0.8, 0.6])
    assert out.returns[0].tolist() == pytest.approx([1.0, 1.0, 1.0])


def test_lambda_zero_is_the_one_step_td_error():
    # δ_0 = 0 + 0.2 − 0.5 = −0.3, δ_1 = 0 + 0.4 − 0.2 = 0.2, δ_2 = 1 + 0 − 0.4 = 0.6; R = δ + V
    out = gae(inputs(MASK, V, [1.0]), gamma=1.0, lam=0.0, normalize=False)
    assert out.advantages[0].tolist() == pytest.approx([-0.3, 0.2, 0.6])
    assert out.returns[0].tolist() == pytest.approx([0.2, 0.4, 1.0])


def test_gamma_and_lambda_a_half_by_hand():
    # γ = 0.5: δ_2 = 1 − 0.4 = 0.6, δ_1 = 0.5·0.4 − 0.2 = 0, δ_0 = 0.5·0.2 − 0.5 = −0.4; γλ = 0.25:
    # A_2 = 0.6, A_1 = 0 + 0.25·0.6 = 0.15, A_0 = −0.4 + 0.25·0.15 = −0.3625; R = A + V
    adv, ret = gae_returns(t([[0.0, 0.0, 1.0]]), t(V), t(MASK), 0.5, 0.5)
    assert adv[0].tolist() == pytest.approx([-0.3625, 0.15, 0.6])
    assert ret[0].tolist() == pytest.approx([0.1375, 0.35, 1.0])


def test_a_masked_token_is_skipped_and_the_kl_is_a_token_reward():
    # the middle token is a tool's output (mask 0, its value ignored): λ = 0, γ = 1:
    # δ_2 = 1 − 0.4 = 0.6, δ_0 = 0 + V_2 − V_0 = −0.1
    out = gae(inputs([[1, 0, 1]], [[0.5, 9.9, 0.4]], [1.0]), gamma=1.0, lam=0.0, normalize=False)
    assert out.advantages[0].tolist() == pytest.approx([-0.1, 0.0, 0.6])
    assert out.returns[0].tolist() == pytest.approx([0.4, 0.0, 1.0])
    # β KL = [0.1, 0.2, 0.3] subtracted per token, V = 0, λ = γ = 1: r = [−0.1, −0.2, 0.7], A = G = [0.4, 0.5, 0.7]
    out = gae(inputs(MASK, [[0.0] * 3], [1.0], kl=[[0.1, 0.2, 0.3]]), gamma=1.0, lam=1.0, normalize=False)
    assert out.advantages[0].tolist() == pytest.approx([0.4, 0.5, 0.7])


@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (1.0, 0.95), (0.9, 0.0), (0.99, 0.5)])
def test_gae_agrees_with_verl(gamma, lam):
    """Rows of different lengths (padding at the end) with observation tokens inside; the outcome
    reward on each row's last trained token, as verl's reward manager puts it on the last valid one."""
    g = torch.Generator().manual_seed(0)
    mask = t([[1, 1, 0, 1, 1, 0], [1, 1, 1, 1, 1, 1], [1, 0, 0, 1, 0, 0], [1, 1, 1, 0, 0, 0]])
    values = torch.randn(mask.shape, generator=g, dtype=torch.float64)
    rewards = t([1.0, -0.5, 0.3, 2.0])
    kl = torch.rand(mask.shape, generator=g, dtype=torch.float64) * 0.1 * mask
    last = [4, 5, 3, 2]
    token_rewards = -kl.clone()
    for i, j in enumerate(last):
        token_rewards[i, j] += rewards[i]
    expected_adv, expected_ret = verl_gae(token_rewards, values, mask, gamma, lam)
    out = gae(AdvantageInputs(mask, torch.zeros_like(mask), rewards, kl, values), gamma=gamma, lam=lam)
    torch.testing.assert_close(out.advantages, expected_adv * mask, atol=1e-12, rtol=0)
    torch.testing.assert_close(out.returns, expected_ret * mask, atol=1e-12, rtol=0)


def test_the_processors_advantages_are_ignored():
    """The ppo preset's reshape still writes a group advantage; GAE reads only rewards, KL and values."""
    plain = inputs(MASK, V, [1.0])
    other = AdvantageInputs(plain.mask, t([[9.0, -9.0, 3.0]]), plain.rewards, plain.kl_penalty, plain.values)
    assert gae(other).advantages.tolist() == gae(plain).advantages.tolist()


def test_fully_masked_rows_are_finite_and_zero():
    out = gae(inputs([[0, 0, 0], [1, 1, 0]], [[float("nan")] * 3, [0.1, 0.2, 0.0]], [5.0, 1.0]))
    assert torch.isfinite(out.advantages).all() and torch.isfinite(out.returns).all()
    assert out.advantages[0].tolist() == [0.0] * 3 and out.returns[0].tolist() == [0.0] * 3
    out = gae(inputs([[0, 0]], [[0.0, 0.0]], [1.0]))  # nothing trained in the whole batch
    assert out.advantages.tolist() == [[0.0, 0.0]] and out.returns.tolist() == [[0.0, 0.0]]


def test_gae_refuses_bad_settings_and_missing_values():
    for kwargs, field in (({"gamma": 1.5}, "gamma"), ({"lam": -0.1}, "lam")):
        with pytest.raises(ValueError, match=field):
            gae(inputs(MASK, V, [1.0]), **kwargs)
    no_values = AdvantageInputs(t(MASK), t([[0.0] * 3]), t([1.0]), t([[0.0] * 3]))
    with pytest.raises(ValueError, match="trainer.critic"):
        gae(no_values)


def test_clipped_value_loss_by_hand():
    # R = 1 everywhere, V_old = 0, ε_v = 0.2, three tokens (the fourth masked):
    #   V = 0.5: unclipped (0.5−1)² = 0.25, clipped (0.2−1)² = 0.64 → max 0.64, clipped branch
    #   V = 1.1: unclipped 0.01, clipped (0.2−1)² = 0.64 → 0.64, clipped branch (PPO2 takes the max: pessimistic)
    #   V = 0.1: inside the clip, both 0.81 → 0.81, not counted as clipped
    values, old, returns = t([[0.5, 1.1, 0.1, 7.0]]), t([[0.0] * 4]), t([[1.0] * 4])
    mask = t([[1, 1, 1, 0]])
    out = clipped_value_loss(values, old, returns, mask, 0.2)
    assert out.token_loss[0].tolist() == pytest.approx([0.32, 0.32, 0.405, 0.0])
    assert out.metrics["vf_clip_fraction"] == pytest.approx(2 / 3)
    plain = clipped_value_loss(values, old, returns, mask, None)
    assert plain.token_loss[0].tolist() == pytest.approx([0.125, 0.005, 0.405, 0.0])
    assert plain.metrics["vf_clip_fraction"] == 0.0
    loss, frac = verl_value_loss(values, returns, old, mask, 0.2)
    assert (out.token_loss.sum() / 3).item() == pytest.approx(loss.item()) and frac.item() == pytest.approx(2 / 3)


def test_clipped_value_loss_against_verl_and_finite_when_masked():
    g = torch.Generator().manual_seed(1)
    values, old, returns = (torch.randn(3, 5, generator=g, dtype=torch.float64) for _ in range(3))
    mask = t([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1], [0, 0, 0, 0, 0]])  # the last row fully masked
    out = clipped_value_loss(values, old, returns, mask, 0.5)
    loss, frac = verl_value_loss(values, returns, old, mask, 0.5)
    assert (out.token_loss.sum() / mask.sum()).item() == pytest.approx(loss.item(), abs=1e-12)
    assert out.metrics["vf_clip_fraction"] == pytest.approx(frac.item(), abs=1e-12)
    inf = clipped_value_loss(values.masked_fill(mask == 0, math.inf), old, returns, mask, 0.5)
    assert torch.isfinite(inf.token_loss).all() and out.token_loss[2].tolist() == [0.0] * 5


def test_a_value_inside_the_clip_is_not_counted_as_clipped_for_a_rounding():
    # float32, |V − V_old| = 0.084 < ε_v = 0.2: V_old + (V − V_old) rounds to V + 1 ulp here, which made
    # the "clipped" branch 3.7e-9 larger than the unclipped one, and counted the token as clipped.
    old, values, returns = (torch.tensor([[x]]) for x in (-0.09553485363721848, -0.01131531037390232,
                                                           -0.15348248183727264))
    assert (old + (values - old)).item() != values.item()  # the rounding this test is about
    out = clipped_value_loss(values, old, returns, torch.ones(1, 1), 0.2)
    assert out.metrics["vf_clip_fraction"] == 0.0
    assert out.token_loss.item() == 0.5 * ((values - returns) ** 2).item()
    # Over many tokens inside the clip, the fraction is 0 (it was 8% in float32, 7% in float64).
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        old, values = ((torch.rand(10_000, 1, generator=g, dtype=dtype) - 0.5) * 0.2 for _ in range(2))
        returns = (torch.rand(10_000, 1, generator=g, dtype=dtype) - 0.5) * 0.4
        out = clipped_value_loss(values, old, returns, torch.ones_like(values), 0.2)
        assert out.metrics["vf_clip_fraction"] == 0.0, dtype
        assert out.metrics["vf_clip_fraction"] == verl_value_loss(values, returns, old, torch.ones_like(values), 0.2)[1]


def test_explained_variance():
    mask = t([[1, 1, 1, 1]])
    returns = t([[1.0, 2.0, 3.0, 4.0]])  # population variance 1.25
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.5), returns, mask) == pytest.approx(0.0)
    # V = R − [1, −1, 1, −1]: Var[R − V] = 1, so 1 − 1/1.25 = 0.2
    assert explained_variance(returns - t([[1.0, -1.0, 1.0, -1.0]]), returns, mask) == pytest.approx(0.2)
    assert explained_variance(returns, t([[3.0] * 4]), mask) is None  # R does not vary
    assert explained_variance(returns, returns, t([[1, 0, 0, 0]])) is None
