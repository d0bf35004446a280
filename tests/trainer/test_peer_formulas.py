"""Issue 49's pieces against their reference implementations: verl 0.9.1 (DRO, the `abs` KL estimator,
token-sum aggregation, GPG's α, rollout correction), TRL 1.16 (VESPO) and Trinity-RFT 0.6 (OPMD). By
hand, and against the reference's formulas (verl's core_algos.py and rollout_corr_helper.py, TRL's
GRPOTrainer, Trinity's policy_loss_fn), written out here as they are written there, on the same
tensors (values and, for losses, gradients)."""

from __future__ import annotations

import math

import pytest
import torch

from undertow.trainer.algorithms import aggregations, kl_estimators, policy_losses

from .test_losses import inputs
from .test_losses_reference import batch, random_batch


def verl_agg_loss(loss_mat, loss_mask, loss_agg_mode, dp_size=1):
    """verl's agg_loss for the two modes compared here (one rank's share; the ranks' mean undoes dp_size)."""
    if loss_agg_mode == "token-mean":
        return (loss_mat * loss_mask).sum() / loss_mask.sum() * dp_size
    if loss_agg_mode == "token-sum":
        return (loss_mat * loss_mask).sum() * dp_size
    raise ValueError(loss_agg_mode)


def verl_dro(old_log_prob, log_prob, advantages, response_mask, beta, loss_agg_mode="token-mean"):
    """verl's compute_policy_loss_dro."""
    log_ratio = log_prob - old_log_prob
    pg_losses = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    return verl_agg_loss(pg_losses, response_mask, loss_agg_mode)


def test_dro_by_hand():
    # A = 2 and 1; log π_θ − log π_old = 0.5 and 0; β = 0.4:
    #   L_1 = −(2 · (−1) − ½ · 0.4 · 0.25) = 2.05,   ∂L_1/∂log π = −(2 − 0.4 · 0.5) = −1.8
    #   L_2 = −(1 · (−2) − 0) = 2,                    ∂L_2/∂log π = −1
    inp, logp = inputs([-1.0, -2.0], [-9.0, -9.0], [2.0, 1.0], proximal=[-1.5, -2.0])
    out = policy_losses.get("dro")(inp, logp, beta=0.4)
    assert out.token_loss[0].tolist() == pytest.approx([2.05, 2.0])
    out.token_loss.sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.8, -1.0])
    assert out.metrics["ratio_mean"] == pytest.approx((math.exp(0.5) + 1) / 2)
    with pytest.raises(ValueError, match="beta"):
        policy_losses.get("dro")(inp, logp, beta=0.0)


@pytest.mark.parametrize("agg", ["token_mean", "token_sum"])
@pytest.mark.parametrize("seed", [0, 1])
def test_dro_matches_verl_in_value_and_gradient(seed, agg):
    logp, old, adv, mask = random_batch(seed)
    expected_lp = logp.clone().requires_grad_(True)
    mode = agg.replace("_", "-")
    expected = verl_dro(old, expected_lp, adv, mask, beta=0.7, loss_agg_mode=mode)
    expected.backward()
    inp, lp = batch(logp.tolist(), old.tolist(), adv.tolist(), mask.tolist())
    inp.proximal_logp = old  # verl's old_log_prob: the actor's own at the step's start
    ours = aggregations.get(agg)(policy_losses.get("dro")(inp, lp, beta=0.7).token_loss, inp.mask)
    ours.backward()
    assert ours.item() == pytest.approx(expected.item(), rel=1e-12)
    assert torch.allclose(lp.grad, expected_lp.grad, rtol=1e-12, atol=1e-15)


def test_token_sum_adds_up_over_micro_batches_as_verl_does_over_ranks():
    loss = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert aggregations.get("token_sum")(loss, mask).item() == 6.0
    assert aggregations.get("token_sum")(loss, mask).item() == verl_agg_loss(loss, mask, "token-sum").item()
    # Two micro-batches (or ranks, each scaled by dp_size and averaged) sum to the whole batch's.
    halves = sum(aggregations.get("token_sum")(loss[i:i + 1], mask[i:i + 1]) for i in range(2))
    ranks = sum(verl_agg_loss(loss[i:i + 1], mask[i:i + 1], "token-sum", dp_size=2) for i in range(2)) / 2
    assert halves.item() == ranks.item() == 6.0


def test_abs_kl_matches_verl():
    logp = torch.tensor([math.log(0.5), math.log(0.25), -1.0], requires_grad=True)
    ref = torch.tensor([math.log(0.25), math.log(0.5), -1.0])
    kl = kl_estimators.get("abs")(logp, ref)
    assert kl.tolist() == pytest.approx([math.log(2), math.log(2), 0.0])
    assert torch.equal(kl, (logp - ref).abs())  # verl's kl_penalty_forward, "abs"
    kl.sum().backward()
    assert logp.grad.tolist() == [1.0, -1.0, 0.0]  # sign(log π_θ − log π_ref); 0 at equality


def verl_gpg(token_level_rewards, response_mask, index, f_norm=1.0):
    """verl's compute_gpg_outcome_advantage."""
    scores = token_level_rewards.sum(dim=-1).clone()
    bsz = scores.shape[0]
    alpha = bsz / torch.count_nonzero(scores).clamp(min=1)
    groups = {}
    for i in range(bsz):
        groups.setdefault(index[i], []).append(scores[i])
    mean = {idx: torch.mean(torch.stack(s)) if len(s) > 1 else torch.tensor(0.0) for idx, s in groups.items()}
    for i in range(bsz):
        scores[i] = alpha * (scores[i] - mean[index[i]]) / f_norm
    return scores.unsqueeze(-1) * response_mask


def test_gpg_transform_matches_verl():
    from undertow.processors.advantages import dr_grpo
    from undertow.trainer.algorithms import AdvantageInputs, advantage_transforms

    # Two groups of 3: rewards [1, 0, 0] and [1, 1, 0]: 3 of 6 non-zero, α = 2.
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 0.0], dtype=torch.float64)
    index = [0, 0, 0, 1, 1, 1]
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.float64)
    group_adv = torch.tensor([a for g in (rewards[:3], rewards[3:]) for a in dr_grpo(g.numpy())], dtype=torch.float64)
    inp = AdvantageInputs(mask, group_adv[:, None] * mask, rewards, torch.zeros_like(mask))
    ours = advantage_transforms.get("gpg")(inp)
    assert ours[0, 0].item() == pytest.approx(2 * (1 - 1 / 3)) and ours[0, 2].item() == 0.0
    token_rewards = torch.zeros_like(mask)
    token_rewards[:, 0] = rewards  # verl sums the token rewards to the score
    assert torch.allclose(ours, verl_gpg(token_rewards, mask, index), rtol=1e-12, atol=0)
    assert torch.allclose(advantage_transforms.get("gpg")(inp, f_norm=4.0), verl_gpg(token_rewards, mask, index, 4.0))
    none = AdvantageInputs(mask, torch.zeros_like(mask), torch.zeros(6, dtype=torch.float64), torch.zeros_like(mask))
    assert advantage_transforms.get("gpg")(none).abs().sum() == 0  # no reward at all: α's count is held at 1


def trl_vespo(per_token_logps, old_per_token_logps, advantages, mask, k_pos=2.0, lambda_pos=3.0, k_neg=3.0,
              lambda_neg=2.0):
    """TRL 1.16's GRPOTrainer, loss_type "vespo" (get_gamma_weights without an IS ratio; the "dapo"
    normaliser over the batch's tokens); advantages [B, 1]."""
    log_ratio = per_token_logps - old_per_token_logps
    with torch.no_grad():
        lower_clamp = math.log(1e-8)
        seq_log_ratio = torch.sum(torch.clamp(log_ratio, -20.0, 20.0) * mask, dim=-1, keepdim=True)
        log_w_seq = torch.clamp(seq_log_ratio, lower_clamp, 20.0)
        w_seq = torch.exp(log_w_seq)
        is_nonneg_adv = advantages >= 0
        k_seq = torch.where(is_nonneg_adv, k_pos, k_neg)
        lambda_seq = torch.where(is_nonneg_adv, lambda_pos, lambda_neg).clamp(min=1e-4)
        phi_seq = torch.exp(lambda_seq + k_seq * log_w_seq - lambda_seq * w_seq).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)
    per_token_loss = -phi_seq * advantages * per_token_logps
    return (per_token_loss * mask).sum() / mask.sum().clamp(min=1.0)


def test_vespo_by_hand():
    # One token, log w = log 2, A = +1 (k 2, λ 3): φ = e^3 · 4 · e^−6 = 4 e^−3; L = −φ · log π.
    inp, logp = inputs([math.log(0.5)], [math.log(0.25)], [1.0])
    out = policy_losses.get("vespo")(inp, logp)
    assert out.token_loss[0, 0].item() == pytest.approx(-4 * math.exp(-3) * math.log(0.5))
    out.token_loss.sum().backward()
    assert logp.grad[0, 0].item() == pytest.approx(-4 * math.exp(-3))  # φ carries no gradient
    # w = 1 gives φ = 1 whatever k and λ: the on-policy loss is REINFORCE's.
    inp, logp = inputs([-1.0, -2.0], [-1.0, -2.0], [-0.5, -0.5])
    assert policy_losses.get("vespo")(inp, logp).token_loss[0].tolist() == pytest.approx([-0.5, -1.0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vespo_matches_trl_in_value_and_gradient(seed):
    logp, behaviour, adv, mask = random_batch(seed)
    expected_lp = logp.clone().requires_grad_(True)
    expected = trl_vespo(expected_lp, behaviour, adv[:, :1], mask)
    expected.backward()
    inp, lp = batch(logp.tolist(), behaviour.tolist(), adv.tolist(), mask.tolist())
    ours = aggregations.get("token_mean")(policy_losses.get("vespo")(inp, lp).token_loss, inp.mask)
    ours.backward()
    assert ours.item() == pytest.approx(expected.item(), rel=1e-12)
    assert torch.allclose(lp.grad, expected_lp.grad, rtol=1e-12, atol=1e-15)


def verl_rollout_is_weights(log_ratio, response_mask, rollout_is, threshold):
    """verl's compute_rollout_correction_weights (no batch normalisation): `threshold` a float (TIS) or a
    "lower_upper" string (IcePop)."""
    if isinstance(threshold, str):
        lower, upper = (float(x) for x in threshold.split("_", 1))
    else:
        lower, upper = None, float(threshold)
    if rollout_is == "token":
        raw = torch.exp(torch.clamp(log_ratio, min=-20.0, max=20.0))
    else:
        log_ratio_sum = (log_ratio * response_mask).sum(dim=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(log_ratio_sum, min=-20.0, max=20.0)).expand_as(log_ratio)
    raw = raw * response_mask
    if lower is None:
        return raw.clamp(max=upper).detach()
    kept = (raw >= lower) & (raw <= upper)
    return torch.where(kept, raw, torch.zeros_like(raw)).detach()


def verl_vanilla_with_rollout_is(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights, clip=0.2,
                                 clip_ratio_c=3.0):
    """verl's compute_policy_loss_vanilla (symmetric clip, dual clip 3), token-mean, pg_losses × rollout_is_weights."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip, 1 + clip)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    pg_losses = pg_losses * rollout_is_weights
    return (pg_losses * response_mask).sum() / response_mask.sum()


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("band", [(None, 1.15), (0.8, 1.2)], ids=["tis", "mis"])
@pytest.mark.parametrize("seed", [0, 1])
def test_rollout_correction_matches_verl_in_value_and_gradient(seed, band, level):
    from undertow.trainer.algorithms.rollout_correction import rollout_weights

    logp, behaviour, adv, mask = random_batch(seed, b=8)  # behaviour: the engine's log-probs
    g = torch.Generator().manual_seed(seed + 10)
    proximal = behaviour + (torch.rand(behaviour.shape, generator=g, dtype=torch.float64) - 0.5) * 0.6  # the trainer's
    lower, upper = band
    threshold = upper if lower is None else f"{lower}_{upper}"
    expected_w = verl_rollout_is_weights(proximal - behaviour, mask, level, threshold)
    w, metrics = rollout_weights(proximal, behaviour, mask, level=level, threshold=upper, lower=lower)
    torch.testing.assert_close(w, expected_w, rtol=1e-12, atol=0)
    assert 0 < metrics["rollout_is_cut_fraction"] < 1, metrics  # the band bites on some tokens, not all
    expected_lp = logp.clone().requires_grad_(True)
    expected = verl_vanilla_with_rollout_is(proximal, expected_lp, adv, mask, expected_w)
    expected.backward()
    inp, lp = batch(logp.tolist(), proximal.tolist(), adv.tolist(), mask.tolist())  # π_old takes the sampler's place
    ours = aggregations.get("token_mean")(w * policy_losses.get("ppo_clip")(inp, lp).token_loss, inp.mask)
    ours.backward()
    assert ours.item() == pytest.approx(expected.item(), rel=1e-12)
    assert torch.allclose(lp.grad, expected_lp.grad, rtol=1e-12, atol=1e-15)


def test_the_rl_objective_weighs_by_the_trainers_over_the_engines_log_probs():
    """Records whose engine log-probs sit 0.3 nats below the trainer's: every token's ρ is e^0.3 = 1.35.
    TIS at 2 keeps it (the loss is 1.35 times the uncorrected one at ratio 1), TIS at 1.2 caps it, and
    MIS on [0.5, 1.2] drops every token (nothing is learned from them)."""
    from undertow.kernel.models import build_model
    from undertow.trainer.config import AlgorithmConfig
    from undertow.trainer.objectives import objectives

    from .helpers import SPEC, make_group

    model = build_model(SPEC)
    advantages = [[3.0, 1.0], [1.0, 1.0], [-1.0, -1.0], [0.0, 2.0]]
    records = [r.model_copy(update={"advantages": a, "behaviour_logprobs": [lp - 0.3 for lp in r.behaviour_logprobs]})
               for r, a in zip(make_group("g"), advantages)]

    def loss(correction):
        rl = objectives.get("rl")(AlgorithmConfig(rollout_correction=correction))
        return rl.loss(model, rl.collate(records, pad_id=0, pad_to_multiple=8))

    on_policy = -0.75  # −mean A over the 8 tokens at ratio 1 against π_old
    assert loss({"threshold": 2.0}).loss.item() == pytest.approx(math.exp(0.3) * on_policy, rel=1e-4)
    assert loss({"threshold": 1.2}).loss.item() == pytest.approx(1.2 * on_policy, rel=1e-4)
    dropped = loss({"threshold": 1.2, "lower": 0.5})
    assert dropped.loss.item() == 0.0 and dropped.metrics["rollout_is_cut_fraction"] == 1.0
    uncorrected = loss(None)  # the ratio to the engine's log-probs: e^0.3, clipped at 1.2 for A > 0
    assert uncorrected.metrics["ratio_mean"] == pytest.approx(math.exp(0.3), rel=1e-4)
    with pytest.raises(ValueError, match="lower: 1.5 is above threshold 1.2"):
        AlgorithmConfig(rollout_correction={"threshold": 1.2, "lower": 1.5})


def trinity_opmd(logprob, action_mask, advantages, tau):
    """Trinity-RFT 0.6's OPMDPolicyLossFn (token-mean aggregation)."""
    pg_losses = -advantages * logprob
    return (pg_losses * action_mask).sum() / action_mask.sum() / (1.0 + tau)


@pytest.mark.parametrize("tau", [0.0, 1.0, 4.0])
def test_opmd_loss_matches_trinity_in_value_and_gradient(tau):
    logp, behaviour, adv, mask = random_batch(int(tau))
    expected_lp = logp.clone().requires_grad_(True)
    expected = trinity_opmd(expected_lp, mask, adv, tau)
    expected.backward()
    inp, lp = batch(logp.tolist(), behaviour.tolist(), adv.tolist(), mask.tolist())
    ours = aggregations.get("token_mean")(policy_losses.get("opmd")(inp, lp, tau=tau).token_loss, inp.mask)
    ours.backward()
    assert ours.item() == pytest.approx(expected.item(), rel=1e-12)
    assert torch.allclose(lp.grad, expected_lp.grad, rtol=1e-12, atol=1e-15)
    # By hand: A = 2, log π = −1, τ = 1: L = 2 / 2 = 1.
    one, lp1 = inputs([-1.0], [-1.0], [2.0])
    assert policy_losses.get("opmd")(one, lp1, tau=1.0).token_loss.item() == 1.0
