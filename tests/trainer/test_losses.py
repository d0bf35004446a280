"""Every policy loss, aggregation, KL estimator, SFT and DPO on small hand-worked tensors."""

from __future__ import annotations

import math

import pytest
import torch

from undertow.trainer.algorithms import (PolicyInputs, aggregations, dpo_loss, entropy, kl_estimators, policy_losses,
                                         preference_losses)
from undertow.trainer.algorithms.sft import sft_token_loss


def inputs(logp, behaviour, adv, mask=None, proximal=None):
    t = lambda v: torch.tensor([v], dtype=torch.float64)
    logp = t(logp).requires_grad_(True)
    inp = PolicyInputs(mask=t(mask or [1.0] * len(adv)), advantages=t(adv), behaviour_logp=t(behaviour),
                       proximal_logp=(t(proximal) if proximal else logp.detach()))
    return inp, logp


def loss_of(name, inp, logp, **kw):
    out = policy_losses.get(name)(inp, logp, **kw)
    return out, out.token_loss[0].tolist()


def test_ppo_ratio_one_is_minus_advantage_and_mask_zeroes():
    inp, logp = inputs([-1.0, -2.0, -3.0], [-1.0, -2.0, -3.0], [2.0, -1.0, 5.0], mask=[1, 1, 0])
    out, tokens = loss_of("ppo_clip", inp, logp)
    assert tokens == pytest.approx([-2.0, 1.0, 0.0])
    assert out.metrics["clip_fraction"] == 0 and out.metrics["ratio_mean"] == pytest.approx(1.0)
    aggregations.get("token_mean")(out.token_loss, inp.mask).backward()
    assert logp.grad[0].tolist() == pytest.approx([-1.0, 0.5, 0.0])  # -A·r·m / 2 tokens


def test_ppo_clips_positive_advantage_and_keeps_pessimistic_negative():
    # ratio 1.5 on both tokens; eps 0.2: A=+1 -> min(1.5, 1.2) = 1.2; A=-1 -> min(-1.5, -1.2) = -1.5
    inp, logp = inputs([math.log(1.5)] * 2, [0.0, 0.0], [1.0, -1.0])
    out, tokens = loss_of("ppo_clip", inp, logp, eps=0.2)
    assert tokens == pytest.approx([-1.2, 1.5])
    assert out.metrics["clip_fraction"] == pytest.approx(0.5)
    out.token_loss.sum().backward()
    assert logp.grad[0, 0] == 0  # the clipped token gets no gradient
    assert logp.grad[0, 1] == pytest.approx(1.5)  # -A · r


def test_dual_clip_bounds_a_huge_ratio_with_negative_advantage():
    inp, logp = inputs([math.log(5.0)], [0.0], [-1.0])
    assert loss_of("ppo_clip", inp, logp, dual_clip=None)[1] == pytest.approx([5.0])
    assert loss_of("ppo_clip", inp, logp)[1] == pytest.approx([3.0])  # min(5, c·|A|), c = 3 by default


def test_dapo_clip_higher_lets_ratio_rise_further():
    inp, logp = inputs([math.log(1.25)], [0.0], [1.0])
    assert loss_of("dapo", inp, logp, eps_low=0.2, eps_high=0.28)[1] == pytest.approx([-1.25])
    assert loss_of("ppo_clip", inp, logp, eps=0.2)[1] == pytest.approx([-1.2])
    inp, logp = inputs([math.log(0.7)], [0.0], [-1.0])  # the lower bound is ε_low: 0.8
    assert loss_of("dapo", inp, logp, eps_low=0.2, eps_high=0.28)[1] == pytest.approx([0.8])


def test_gspo_uses_the_length_normalised_sequence_ratio():
    # log-ratios 0.1 and 0.3 -> s = exp(0.2) = 1.2214 on every token
    inp, logp = inputs([0.1 - 1, 0.3 - 1], [-1.0, -1.0], [-1.0, -1.0])
    out, tokens = loss_of("gspo", inp, logp)
    assert tokens == pytest.approx([math.exp(0.2)] * 2)  # A<0: min(-s, -clip(s)) = -s
    assert out.metrics["ratio_mean"] == pytest.approx(math.exp(0.2))
    inp, logp = inputs([0.1 - 1, 0.3 - 1], [-1.0, -1.0], [1.0, 1.0])
    assert loss_of("gspo", inp, logp, eps_low=3e-4, eps_high=4e-4)[1] == pytest.approx([-1.0004] * 2)


def test_cispo_clips_the_weight_but_keeps_the_gradient():
    inp, logp = inputs([math.log(1.5)], [0.0], [1.0])
    out, tokens = loss_of("cispo", inp, logp, eps_high=0.28)
    assert tokens == pytest.approx([-1.28 * math.log(1.5)])
    out.token_loss.sum().backward()
    assert logp.grad[0, 0] == pytest.approx(-1.28)  # PPO would give 0 here
    assert out.metrics["clip_fraction"] == 1.0


def test_reinforce_and_truncated_is_weights():
    inp, logp = inputs([-1.0], [-1.5], [2.0])  # w = e^0.5 = 1.6487
    assert loss_of("reinforce", inp, logp)[1] == pytest.approx([-math.exp(0.5) * 2 * -1.0])
    assert loss_of("truncated_is", inp, logp, cap=1.5)[1] == pytest.approx([-1.5 * 2 * -1.0])
    assert loss_of("truncated_is", inp, logp, cap=2.0)[1] == pytest.approx([math.exp(0.5) * 2])


def test_decoupled_ppo_weights_by_proximal_over_behaviour():
    inp, logp = inputs([-1.0], [-1.5], [2.0])  # proximal = current: r = 1, w = e^0.5
    out, tokens = loss_of("decoupled_ppo", inp, logp)
    assert tokens == pytest.approx([-math.exp(0.5) * 2])
    assert loss_of("decoupled_ppo", inp, logp, max_behaviour_weight=1.2)[1] == pytest.approx([-2.4])
    # trust region around the proximal policy: r = 1.5 clips at 1.2, weighted by w = 1 / 1.5
    inp, logp = inputs([math.log(1.5)], [math.log(1.5)], [1.0], proximal=[0.0])
    assert loss_of("decoupled_ppo", inp, logp)[1] == pytest.approx([-1.2 / 1.5])


def test_aggregations():
    loss = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    agg = lambda name, **kw: aggregations.get(name)(loss, mask, **kw).item()
    assert agg("token_mean") == pytest.approx(6 / 3)
    assert agg("seq_mean_token_sum") == pytest.approx((3 + 3) / 2)
    assert agg("seq_mean_token_mean") == pytest.approx((1.5 + 3) / 2)
    assert agg("seq_mean_token_sum_norm", max_tokens=4) == pytest.approx(6 / (2 * 4))


def test_kl_estimators_and_entropy():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])  # log r = −log 2
    assert kl_estimators.get("k1")(logp, ref).item() == pytest.approx(math.log(2))
    assert kl_estimators.get("k2")(logp, ref).item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert kl_estimators.get("k3")(logp, ref).item() == pytest.approx(0.5 - 1 + math.log(2))
    assert kl_estimators.get("k3")(logp, logp).item() == 0.0
    assert entropy(torch.zeros(1, 1, 4)).item() == pytest.approx(math.log(4))


def test_sft_is_masked_nll():
    logp, mask = torch.tensor([[-1.0, -2.0, -3.0]]), torch.tensor([[1.0, 0.0, 1.0]])
    assert aggregations.get("token_mean")(sft_token_loss(logp, mask), mask).item() == pytest.approx(2.0)


def test_dpo_matches_its_closed_form():
    t = lambda v: torch.tensor([v])
    out = dpo_loss(t(-1.0), t(-3.0), t(-2.0), t(-2.0), beta=0.5)  # margin 2, h = 1
    assert out.loss.item() == pytest.approx(math.log(1 + math.exp(-1)))
    assert out.reward_margin == pytest.approx(2.0) and out.accuracy == 1.0
    assert dpo_loss(t(-2.0), t(-2.0), t(-2.0), t(-2.0)).loss.item() == pytest.approx(math.log(2))


def softplus(x: float) -> float:
    return math.log(1 + math.exp(x))


@pytest.mark.parametrize("name, kw, margin, want", [
    ("sigmoid", {}, 2.0, softplus(-1.0)),                                   # −log σ(βm), βm = 1
    # TRL's "robust": (−(1−ε) log σ(βm) + ε log σ(−βm)) / (1 − 2ε), written with softplus: −log σ(x) = softplus(−x)
    ("robust", {"label_smoothing": 0.1}, 2.0, (0.9 * softplus(-1.0) - 0.1 * softplus(1.0)) / 0.8),
    ("robust", {"label_smoothing": 0.0}, 2.0, softplus(-1.0)),              # no flips: DPO
    ("hinge", {}, 2.0, 0.0),                                                # max(0, 1 − βm) = max(0, 0)
    ("hinge", {}, 1.0, 0.5),
    ("ipo", {}, 2.0, 1.0),                                                  # (m − 1/(2β))² = (2 − 1)²
    ("ipo", {}, 0.0, 1.0),
])
def test_preference_losses_by_hand(name, kw, margin, want):
    t = lambda v: torch.tensor([v])
    loss = preference_losses.resolve({"name": name, **kw}).bind()
    out = dpo_loss(t(-2.0 + margin), t(-2.0), t(-2.0), t(-2.0), beta=0.5, loss=loss)
    assert out.loss.item() == pytest.approx(want) and out.reward_margin == pytest.approx(margin)


def test_the_dpo_objective_takes_its_preference_loss_from_config():
    from undertow.trainer.config import AlgorithmConfig
    from undertow.trainer.objectives import DPOObjective

    objective = DPOObjective(AlgorithmConfig(objective="dpo", preference_loss="ipo", dpo_beta=0.5))
    assert objective.preference_loss(torch.tensor([2.0]), 0.5).item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"preference loss 'ipoo': unknown \(did you mean 'ipo'\?\)"):
        AlgorithmConfig(objective="dpo", preference_loss="ipoo")


LOSSES = ["ppo_clip", "dapo", "gspo", "gmpo", "cispo", "sapo", "clip_cov", "kl_cov", "dppo_tv", "dppo_kl", "reinforce",
          "truncated_is", "decoupled_ppo", "dro", "vespo", "opmd"]


@pytest.mark.parametrize("name", LOSSES)
def test_an_overflow_at_a_masked_position_leaves_loss_and_gradient_finite(name):
    # fp32, as trained: log-ratio 100 at the masked (prompt or padding) position, e^100 = inf there.
    logp = torch.tensor([[-1.0, 99.0]], requires_grad=True)
    inp = PolicyInputs(mask=torch.tensor([[1.0, 0.0]]), advantages=torch.tensor([[1.0, 0.0]]),
                       behaviour_logp=torch.tensor([[-1.2, -1.0]]), proximal_logp=torch.tensor([[-1.1, -1.0]]))
    out = policy_losses.get(name)(inp, logp)
    loss = aggregations.get("token_mean")(out.token_loss, inp.mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all() and logp.grad[0, 1] == 0
    assert all(math.isfinite(v) for v in out.metrics.values())


@pytest.mark.parametrize("name", ["ppo_clip", "dapo"])
def test_a_huge_log_ratio_on_a_trained_token_gives_finite_gradients(name):
    logp = torch.tensor([[99.0, -1.0]], requires_grad=True)  # log-ratio +100 against the behaviour policy
    inp = PolicyInputs(mask=torch.ones(1, 2), advantages=torch.tensor([[-1.0, 1.0]]),
                       behaviour_logp=torch.tensor([[-1.0, -1.0]]), proximal_logp=torch.zeros(1, 2))
    loss = aggregations.get("token_mean")(policy_losses.get(name)(inp, logp).token_loss, inp.mask)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()


def test_k3_is_clamped_like_verl():
    logp = torch.tensor([0.0, 0.0, 0.0], requires_grad=True)
    ref = torch.tensor([25.0, -25.0, math.log(2.0)])  # log r = 25 gave 7.2e10 unclamped
    k3 = kl_estimators.get("k3")(logp, ref)
    assert k3[:2].tolist() == [10.0, 10.0]  # clamp(e^±20 − 1 ∓ 20) at 10
    assert k3[2].item() == pytest.approx(1 - math.log(2.0))
    k3.sum().backward()
    assert logp.grad.tolist()[:2] == [0.0, 0.0] and logp.grad[2].item() == pytest.approx(1 - 2.0)


def test_every_registered_loss_is_listed_here():
    assert sorted(LOSSES) == policy_losses.names()


@pytest.mark.parametrize("log_ratio", [100.0, -100.0])
@pytest.mark.parametrize("advantage", [1.0, -1.0])
@pytest.mark.parametrize("name", LOSSES)
def test_every_loss_is_finite_and_bounded_at_an_extreme_log_ratio(name, advantage, log_ratio):
    """One valid token 100 nats away from the behaviour policy (fp32, as trained): before the clamps
    GSPO's loss was 7.3e7 and REINFORCE's -8.1e6. Bounded as verl's clamps bound them: by e^10 · |A|
    times the token's |log π| (REINFORCE-style losses multiply by it), plus KL-Cov's penalty β |log r|
    at its clamp (10) when the token is the one it penalises, and the gradient finite."""
    logp = torch.tensor([[-0.5, -1.0]], requires_grad=True)
    inp = PolicyInputs(mask=torch.ones(1, 2), advantages=torch.full((1, 2), advantage),
                       behaviour_logp=torch.tensor([[-0.5 - log_ratio, -1.0]]), proximal_logp=torch.tensor([[-0.5, -1.0]]))
    out = policy_losses.get(name)(inp, logp)
    loss = aggregations.get("token_mean")(out.token_loss, inp.mask)
    loss.backward()
    bound = math.exp(10.0) * abs(advantage) * 1.0 + (10.0 if name == "kl_cov" else 0.0)
    assert torch.isfinite(out.token_loss).all() and torch.isfinite(logp.grad).all()
    assert out.token_loss.abs().max().item() <= bound, out.token_loss


def gmpo_by_the_paper(logp: list[float], behaviour: list[float], adv: float, eps: float) -> torch.Tensor:
    """−sgn(A) · Π_t |min(r_t A, clip(r_t, e^−ε, e^ε) A)|^(1/|o|), written as the paper's product (eq. 6):
    an independent form of what trainer/algorithms/gmpo.py computes in log space."""
    lp = torch.tensor(logp, dtype=torch.float64, requires_grad=True)
    r = torch.exp(lp - torch.tensor(behaviour, dtype=torch.float64))
    clipped = r.clamp(math.exp(-eps), math.exp(eps))
    factors = torch.minimum(r * adv, clipped * adv).abs()  # |min(r_t A, clip(r_t) A)|
    objective = math.copysign(1.0, adv) * torch.prod(factors) ** (1 / len(logp))
    return -objective, lp


@pytest.mark.parametrize("adv", [1.0, -1.0, 2.5])
def test_gmpo_matches_the_papers_product_form_in_value_and_gradient(adv):
    logp, behaviour = [-1.0, -0.7, -2.0], [-1.1, -1.3, -1.8]  # log-ratios 0.1, 0.6 (clipped at 0.4 for A > 0), -0.2
    expected, lp = gmpo_by_the_paper(logp, behaviour, adv, eps=0.4)
    expected.backward()
    inp, ours = inputs(logp, behaviour, [adv] * 3)
    out = policy_losses.get("gmpo")(inp, ours, eps_low=0.4, eps_high=0.4)
    loss = aggregations.get("seq_mean_token_mean")(out.token_loss, inp.mask)
    loss.backward()
    assert loss.item() == pytest.approx(expected.item())
    assert ours.grad[0].tolist() == pytest.approx(lp.grad.tolist())


def test_gmpo_by_hand():
    # log-ratios 0.1 and 0.6, A = +1, ε = 0.4: ℓ = (0.1, 0.4), s = e^0.25; the clipped token gets no gradient.
    inp, logp = inputs([0.1, 0.6], [0.0, 0.0], [1.0, 1.0])
    out = policy_losses.get("gmpo")(inp, logp)
    loss = aggregations.get("seq_mean_token_mean")(out.token_loss, inp.mask)
    loss.backward()
    assert loss.item() == pytest.approx(-math.exp(0.25))
    assert logp.grad[0].tolist() == pytest.approx([-math.exp(0.25) / 2, 0.0])
    assert out.metrics["clip_fraction"] == pytest.approx(0.5)

