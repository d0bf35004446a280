"""The policy losses of issue 30 (SAPO, Clip-Cov, KL-Cov, DPPO) and the KL variants (low_var_kl, k1+ / k3+,
TRL's bias correction): by hand, and against the reference implementations' formulas (verl's
core_algos.py, TRL's GRPOTrainer), written out here as they are written there, on the same tensors."""

from __future__ import annotations

import math

import pytest
import torch

from undertow.trainer.algorithms import PolicyInputs, aggregations, kl_estimators, policy_losses

from .test_losses import inputs, loss_of


def batch(logp, behaviour, adv, mask):
    """[B, T] float64 tensors from nested lists; logp requires grad."""
    t = lambda v: torch.tensor(v, dtype=torch.float64)
    lp = t(logp).requires_grad_(True)
    return PolicyInputs(mask=t(mask), advantages=t(adv), behaviour_logp=t(behaviour), proximal_logp=lp.detach()), lp


def random_batch(seed: int, b: int = 3, t: int = 5):
    g = torch.Generator().manual_seed(seed)
    logp = -torch.rand(b, t, generator=g, dtype=torch.float64) * 3
    behaviour = logp + (torch.rand(b, t, generator=g, dtype=torch.float64) - 0.5) * 0.8  # ratios ~ e^±0.4
    adv = (torch.randn(b, 1, generator=g, dtype=torch.float64) * 2).expand(b, t).clone()
    mask = (torch.rand(b, t, generator=g) > 0.25).double()
    mask[-1] = 0.0  # a fully masked row
    return logp, behaviour, adv, mask


def verl_sapo(old_log_prob, log_prob, advantages, response_mask, tau_pos, tau_neg):
    """verl's compute_policy_loss_sapo, as written there: gates σ(τ(r − 1)) · 4/τ, seq-mean-token-mean."""
    ratio = torch.exp((log_prob - old_log_prob).clamp(-20.0, 20.0))
    taus = torch.where(advantages > 0, torch.tensor(tau_pos, dtype=advantages.dtype), torch.tensor(tau_neg, dtype=advantages.dtype))
    pg_losses = -torch.sigmoid(taus * (ratio - 1.0)) * (4.0 / taus) * advantages
    seq = (pg_losses * response_mask).sum(-1) / response_mask.sum(-1).clamp(min=1)
    return seq.sum() / response_mask.shape[0]


def test_sapo_by_hand():
    # on-policy, A = +1, τ = 1: f(1) = 4 σ(0) = 2, and f'(1) = 4 σ(0)(1 − σ(0)) = 1: PPO's gradient −A
    inp, logp = inputs([-1.0, math.log(1.5)], [-1.0, 0.0], [1.0, -1.0])
    out, tokens = loss_of("sapo", inp, logp, tau_pos=1.0, tau_neg=1.05)
    sig = 1 / (1 + math.exp(-1.05 * 0.5))  # r = 1.5, A = −1, τ_neg: L = +4/1.05 · σ(1.05 · 0.5)
    assert tokens == pytest.approx([-2.0, 4 / 1.05 * sig])
    out.token_loss.sum().backward()
    assert logp.grad[0, 0].item() == pytest.approx(-1.0)
    assert logp.grad[0, 1].item() == pytest.approx(4 * sig * (1 - sig) * 1.5)  # −A · f'(r) · r


@pytest.mark.parametrize("seed", [0, 1])
def test_sapo_matches_verl_in_value_and_gradient(seed):
    logp, behaviour, adv, mask = random_batch(seed)
    ours = logp.clone().requires_grad_(True)
    inp = PolicyInputs(mask=mask, advantages=adv, behaviour_logp=behaviour, proximal_logp=logp)
    loss = aggregations.get("seq_mean_token_mean")(policy_losses.get("sapo")(inp, ours).token_loss, mask)
    loss.backward()
    theirs = logp.clone().requires_grad_(True)
    expected = verl_sapo(behaviour, theirs, adv, mask, 1.0, 1.05)
    expected.backward()
    assert loss.item() == pytest.approx(expected.item())
    torch.testing.assert_close(ours.grad, theirs.grad)


# Four on-policy tokens (r = 1, no PPO clip): A = [3, −1, −1, −1] (mean 0), log π = [−0.5, −1.5, −1.5, −0.5]
# (mean −1): Cov_t = A_t · (log π_t + 1) = [1.5, 0.5, 0.5, −0.5]. Only token 0 lies in (lb 1, ub 5) and has
# the largest covariance; one token is treated (max(1, ⌊2e-4 · 4⌋)).
COV_LOGP, COV_ADV = [-0.5, -1.5, -1.5, -0.5], [3.0, -1.0, -1.0, -1.0]


def test_clip_cov_cuts_the_gradient_of_the_high_covariance_token():
    inp, logp = inputs(COV_LOGP, COV_LOGP, COV_ADV)
    out, tokens = loss_of("clip_cov", inp, logp)
    assert tokens == pytest.approx([0.0, 1.0, 1.0, 1.0])  # −A · r, token 0 cut
    out.token_loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([0.0, 1.0, 1.0, 1.0])
    assert out.metrics["cov_cut_fraction"] == pytest.approx(0.25)


def test_kl_cov_penalises_the_high_covariance_token():
    # log r = [0.2, 0, 0, −0.1]; token 0 (largest Cov) gets −A r + |log r|, the others −A r, unclipped
    inp, logp = inputs(COV_LOGP, [a - b for a, b in zip(COV_LOGP, [0.2, 0.0, 0.0, -0.1])], COV_ADV)
    out, tokens = loss_of("kl_cov", inp, logp)
    assert tokens == pytest.approx([-3 * math.exp(0.2) + 0.2, 1.0, 1.0, math.exp(-0.1)])
    out.token_loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-3 * math.exp(0.2) + 1.0, 1.0, 1.0, math.exp(-0.1)])


def verl_clip_cov(old_log_prob, log_prob, advantages, response_mask, cliprange, ratio_, lb, ub):
    """verl's compute_policy_loss_clip_cov (no dual clip), its token losses; every candidate is cut when
    clip_num covers them all, which makes its random pick deterministic."""
    ratio = torch.exp(log_prob - old_log_prob)
    pg1 = -advantages * ratio
    pg2 = -advantages * torch.clamp(ratio, 1 - cliprange, 1 + cliprange)
    clip_by_origin = (pg2 > pg1) & (response_mask > 0)
    mean = lambda x: (x * response_mask).sum() / response_mask.sum()
    cov = (advantages - mean(advantages)) * (log_prob - mean(log_prob.detach()))
    cov[response_mask == 0] = -torch.inf
    cov[clip_by_origin] = -torch.inf
    clip_num = max(int(ratio_ * response_mask.sum().item()), 1)
    idx = torch.nonzero((cov < ub) & (cov > lb) & (response_mask > 0))
    assert len(idx) <= clip_num
    corr = torch.ones_like(advantages)
    corr[idx[:, 0], idx[:, 1]] = 0
    return torch.maximum(pg1, pg2) * corr


def verl_kl_cov(old_log_prob, log_prob, advantages, response_mask, kl_cov_ratio, ppo_kl_coef):
    """verl's compute_policy_loss_kl_cov, its token losses."""
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    pg_losses = -advantages * ratio
    pg_losses_kl = -advantages * ratio + ppo_kl_coef * negative_approx_kl.abs()
    valid = response_mask > 0
    valid_idx = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
    adv, lp = advantages[valid].detach(), log_prob[valid].detach()
    cov = (adv - adv.mean()) * (lp - lp.mean())
    top = valid_idx[torch.topk(cov, max(1, int(len(cov) * kl_cov_ratio))).indices]
    width = advantages.shape[1]
    pg_losses = pg_losses.clone()
    pg_losses[top // width, top % width] = pg_losses_kl[top // width, top % width]
    return pg_losses


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_clip_cov_and_kl_cov_match_verl_in_value_and_gradient(seed):
    logp, behaviour, adv, mask = random_batch(seed, b=4, t=6)
    mask[-1] = 1.0  # verl needs every row's tokens for its means; a fully masked row is tested apart
    for name, kw, reference in (
            ("clip_cov", {"clip_cov_ratio": 1.0, "clip_cov_lb": 0.2, "clip_cov_ub": 5.0, "dual_clip": None},
             lambda o, l, a, m: verl_clip_cov(o, l, a, m, 0.2, 1.0, 0.2, 5.0)),
            ("kl_cov", {"kl_cov_ratio": 0.25, "ppo_kl_coef": 1.0}, lambda o, l, a, m: verl_kl_cov(o, l, a, m, 0.25, 1.0))):
        ours, theirs = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
        inp = PolicyInputs(mask=mask, advantages=adv, behaviour_logp=behaviour, proximal_logp=logp)
        got = policy_losses.get(name)(inp, ours, **kw).token_loss
        want = reference(behaviour, theirs, adv, mask) * mask
        torch.testing.assert_close(got, want)
        got.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(ours.grad, theirs.grad)


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov", "sapo"])
def test_a_fully_masked_batch_gives_zero_loss(name):
    inp, logp = batch([[-1.0, -2.0]], [[-1.5, -2.5]], [[1.0, 1.0]], [[0.0, 0.0]])
    out = policy_losses.get(name)(inp, logp)
    assert out.token_loss.abs().sum().item() == 0.0 and all(math.isfinite(v) for v in out.metrics.values())


def test_kl_variants_low_var_and_straight_through():
    logp = torch.tensor([math.log(0.5), math.log(0.9)], requires_grad=True)
    ref = torch.tensor([math.log(0.25), math.log(0.3)])
    k = lambda name: kl_estimators.get(name)(logp, ref)
    assert k("low_var_kl").tolist() == k("k3").tolist()  # verl's name for the clamped k3
    for plus, plain in (("k1+", "k1"), ("k3+", "k3")):
        value = k(plus)
        assert value.tolist() == pytest.approx(k(plain).tolist())  # the value of k1 / k3 ...
        (grad,) = torch.autograd.grad(value.sum(), logp)
        # ... and the gradient of k2 = ½ (log π − log π_ref)²: log π − log π_ref (log 2 on the first token)
        assert grad.tolist() == pytest.approx((logp - ref).tolist())
        assert grad[0].item() == pytest.approx(math.log(2))


def test_bias_corrected_kl_matches_trl():
    """TRL's GRPOTrainer with use_bias_correction_kl: per_token_kl = (e^(ref − logp) − (ref − logp) − 1)
    · coef_1, coef_1 = exp(logp − old), the gradient flowing through both."""
    from undertow.trainer.algorithms import bias_corrected

    logp, old, ref = torch.tensor([-1.0, -0.3, -2.0]), torch.tensor([-1.2, -0.3, -1.5]), torch.tensor([-0.8, -0.5, -2.5])
    ours, theirs = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    got = bias_corrected(kl_estimators.get("k3")(ours, ref), ours, old)
    want = (torch.exp(ref - theirs) - (ref - theirs) - 1) * torch.exp(theirs - old)
    torch.testing.assert_close(got, want)
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad)
    assert got[1].item() == pytest.approx(math.exp(-0.2) + 0.2 - 1)  # on-policy token: the ratio is 1


def verl_dppo(old_log_prob, log_prob, advantages, divergence, low, high, clip_ratio_c=20.0):
    """verl's compute_policy_loss_dppo_tv / _kl, their token losses."""
    ratio = torch.exp((log_prob - old_log_prob).clamp(-20.0, 20.0))
    truncated = torch.clamp(ratio, max=clip_ratio_c).detach()
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    if divergence == "tv":
        pos, neg = (prob - old_prob) <= high, (prob - old_prob) >= -low
    else:
        binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
            (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
        pos, neg = (binary_kl <= high) | (prob <= old_prob), (binary_kl <= low) | (prob >= old_prob)
    valid = torch.where(advantages > 0, pos, neg).detach().float()
    return -advantages * truncated * log_prob * valid


def test_dppo_tv_by_hand():
    # q = 0.5 on every token. p = 0.6 (moved +0.1 ≤ 0.15), 0.7 (+0.2 > 0.15), 0.4 (−0.1), 0.3 (−0.2)
    p = [0.6, 0.7, 0.4, 0.3]
    inp, logp = inputs([math.log(x) for x in p], [math.log(0.5)] * 4, [1.0, 1.0, -1.0, -1.0])
    out, tokens = loss_of("dppo_tv", inp, logp)
    # valid: A > 0 needs p − q ≤ 0.15 (token 1 is out); A < 0 needs p − q ≥ −0.15 (token 3 is out)
    # L = −A · r · log p with r = p / 0.5 (no truncation below 20)
    assert tokens == pytest.approx([-1.2 * math.log(0.6), 0.0, 0.8 * math.log(0.4), 0.0])
    out.token_loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.2, 0.0, 0.8, 0.0])  # −A · sg[r]
    assert out.metrics["clip_fraction"] == pytest.approx(0.5)


def test_dppo_kl_masks_a_large_move_of_a_likely_token_but_not_of_a_rare_one():
    # q 0.99 → p 0.8: ratio 0.81 (PPO's box keeps it), binary KL 0.99 log(0.99/0.8) + 0.01 log(0.01/0.2) ≈ 0.181 > 0.05
    # q 1e-5 → p 1e-3: ratio 100 (PPO clips it), binary KL ≈ 0.00095 ≤ 0.05: kept (truncated at 20)
    inp, logp = inputs([math.log(0.8), math.log(1e-3)], [math.log(0.99), math.log(1e-5)], [-1.0, 1.0])
    out, tokens = loss_of("dppo_kl", inp, logp)
    assert tokens == pytest.approx([0.0, -20 * math.log(1e-3)])


@pytest.mark.parametrize("divergence", ["tv", "kl"])
@pytest.mark.parametrize("seed", [0, 1])
def test_dppo_matches_verl_in_value_and_gradient(divergence, seed):
    logp, behaviour, adv, mask = random_batch(seed, b=4, t=6)
    behaviour = logp + (behaviour - logp) * 4  # moves of up to ±1.6 nats: some tokens leave the region
    ours, theirs = logp.clone().requires_grad_(True), logp.clone().requires_grad_(True)
    inp = PolicyInputs(mask=mask, advantages=adv, behaviour_logp=behaviour, proximal_logp=logp)
    delta = {"tv": 0.15, "kl": 0.05}[divergence]
    got = policy_losses.get(f"dppo_{divergence}")(inp, ours).token_loss
    want = verl_dppo(behaviour, theirs, adv, divergence, delta, delta) * mask
    torch.testing.assert_close(got, want)
    assert 0 < (got[mask > 0] == 0).sum() < (mask > 0).sum()  # the mask binds on some tokens, not all
    got.sum().backward()
    want.sum().backward()
    torch.testing.assert_close(ours.grad, theirs.grad)
