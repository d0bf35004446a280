"""KTO, SimPO and ORPO: by hand, against TRL's formulas on the same tensors, at the edges (empty rows,
extreme log-probs), and as objectives on the tiny model."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from undertow.kernel.models import build_model
from undertow.schemas import PreferencePair
from undertow.trainer.algorithms.kto import kto_loss, reference_point, rotated
from undertow.trainer.algorithms.orpo import log_odds, odds_ratio_loss
from undertow.trainer.algorithms.simpo import simpo_loss
from undertow.trainer.config import AlgorithmConfig
from undertow.trainer.objectives import objectives

from .helpers import SPEC, behaviour_logprobs, make_group

t = lambda *v: torch.tensor(v, dtype=torch.float64)
sigmoid = lambda x: 1 / (1 + math.exp(-x))


def test_kto_by_hand():
    # β 1, z0 0.5: desirable r = 2 → λ_D (1 − σ(1.5)); undesirable r = −1 → λ_U (1 − σ(0.5 + 1)).
    out = kto_loss(t(2.0), t(-1.0), 0.5, beta=1.0, desirable_weight=2.0, undesirable_weight=1.0)
    assert out.losses.tolist() == pytest.approx([2 * (1 - sigmoid(1.5)), 1 - sigmoid(1.5)])
    assert out.reward_margin == pytest.approx(3.0) and out.accuracy == 1.0 and out.z0 == 0.5
    # z0 = max(0, mean(π − ref)) on the mismatched examples: mean(1, 0) = 0.5; a negative mean gives 0.
    assert reference_point(t(-3.0, -4.0), t(-4.0, -4.0)).item() == 0.5
    assert reference_point(t(-5.0, -4.0), t(-4.0, -4.0)).item() == 0.0
    assert rotated(3) == [2, 0, 1] and rotated(1) == [0]  # example i is paired with the response of i − 1


def trl_kto(chosen_logratios, rejected_logratios, kl, beta, dw, uw):
    """TRL KTOTrainer.kto_loss, loss_type "kto", written out from its source (the KL already clamped)."""
    chosen_losses = 1 - F.sigmoid(beta * (chosen_logratios - kl))
    rejected_losses = 1 - F.sigmoid(beta * (kl - rejected_logratios))
    return torch.cat((dw * chosen_losses, uw * rejected_losses), 0).nanmean()


def test_kto_agrees_with_trl():
    g = torch.Generator().manual_seed(0)
    policy, ref = -torch.rand(2, 5, generator=g, dtype=torch.float64) * 20, -torch.rand(2, 5, generator=g, dtype=torch.float64) * 20
    kl_policy, kl_ref = -torch.rand(10, generator=g, dtype=torch.float64) * 20, -torch.rand(10, generator=g, dtype=torch.float64) * 20
    kl = (kl_policy - kl_ref).mean().clamp(min=0)  # TRL: the gathered mean, clamped at 0
    z0 = reference_point(kl_policy, kl_ref)
    out = kto_loss(policy[0] - ref[0], policy[1] - ref[1], z0, beta=0.3, desirable_weight=1.3, undesirable_weight=0.7)
    want = trl_kto(policy[0] - ref[0], policy[1] - ref[1], kl, 0.3, 1.3, 0.7)
    assert out.losses.mean().item() == pytest.approx(want.item(), rel=1e-12)


def test_simpo_by_hand_and_as_trl_writes_it():
    # chosen: summed −2 over 2 tokens (mean −1); rejected: −6 over 3 (mean −2). β 2, γ 1: −log σ(2·1 − 1).
    out = simpo_loss(t(-2.0), t(-6.0), t(2.0), t(3.0), beta=2.0, gamma=1.0)
    assert out.losses.item() == pytest.approx(math.log(1 + math.exp(-1.0)))
    assert out.reward_margin == pytest.approx(1.0) and out.accuracy == 1.0
    # TRL's CPOTrainer (loss_type "simpo", label_smoothing 0): logits = Δ − γ/β; loss = −logsigmoid(β logits).
    g = torch.Generator().manual_seed(1)
    chosen, rejected = -torch.rand(6, generator=g, dtype=torch.float64) * 30, -torch.rand(6, generator=g, dtype=torch.float64) * 30
    cl, rl = t(1, 2, 3, 4, 5, 6), t(6, 5, 4, 3, 2, 1)
    trl = -F.logsigmoid(2.5 * ((chosen / cl - rejected / rl) - 1.2 / 2.5))
    torch.testing.assert_close(simpo_loss(chosen, rejected, cl, rl, beta=2.5, gamma=1.2).losses, trl)


def test_orpo_by_hand_and_as_trl_writes_it():
    # mean log-probs log 0.5 (odds 1) and log 0.2 (odds 1/4): L_OR = −log σ(log 4) = log(1 + 1/4).
    out = odds_ratio_loss(t(math.log(0.5)), t(math.log(0.2)))
    assert out.or_losses.item() == pytest.approx(math.log(1.25))
    assert out.log_odds_ratio == pytest.approx(math.log(4)) and out.accuracy == 1.0
    # TRL's ORPOTrainer.odds_ratio_loss: log_odds = (c − r) − (log1p(−e^c) − log1p(−e^r)); −logsigmoid of it.
    g = torch.Generator().manual_seed(2)
    c, r = -torch.rand(6, generator=g, dtype=torch.float64) * 5 - 0.01, -torch.rand(6, generator=g, dtype=torch.float64) * 5 - 0.01
    trl = -F.logsigmoid((c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r))))
    torch.testing.assert_close(odds_ratio_loss(c, r).or_losses, trl)


def test_edges_stay_finite_and_bounded():
    """fp32 as trained: log-ratios of ±1e4, a certain answer (mean log-prob 0), responses with no tokens."""
    big = torch.tensor([1e4, -1e4, 0.0], requires_grad=True)
    kto = kto_loss(big, -big, 1e4, beta=0.1)
    kto.losses.sum().backward()
    assert torch.isfinite(kto.losses).all() and (kto.losses >= 0).all() and (kto.losses <= 1).all()
    assert torch.isfinite(big.grad).all()
    zero = torch.zeros(3)
    simpo = simpo_loss(torch.tensor([-1e4, 0.0, 0.0]), torch.tensor([0.0, -1e4, 0.0]), torch.tensor([1.0, 0.0, 0.0]),
                       zero, beta=2.0, gamma=1.0)  # the last two rows: no tokens, mean log-prob 0, not NaN
    assert torch.isfinite(simpo.losses).all() and simpo.losses[1].item() == pytest.approx(0.0, abs=1e-6)
    assert simpo.losses[2].item() == pytest.approx(math.log(1 + math.exp(1.0)))  # −log σ(2·0 − 1)
    a = torch.tensor([0.0, -1e-12, -1e4, -88.0], requires_grad=True)  # P = 1, P ≈ 1, P ≈ 0
    odds = log_odds(a)
    orpo = odds_ratio_loss(a, a.flip(0))
    (odds.sum() + orpo.or_losses.sum()).backward()
    assert torch.isfinite(odds).all() and odds[0].item() == pytest.approx(-1e-6 - math.log(1e-6), rel=1e-3)
    assert torch.isfinite(orpo.or_losses).all() and torch.isfinite(a.grad).all()


def a_pair(model=None) -> PreferencePair:
    good, bad = make_group("g")[:2]
    return PreferencePair(pair_id="p", task_id="t", prompt_tokens=good.prompt_tokens,
                          chosen_tokens=good.response_tokens, rejected_tokens=bad.response_tokens)


def run(name: str, records, model, ref=None, **algo):
    objective = objectives.get(name)(AlgorithmConfig(objective=name, **algo))
    batch = objective.collate(records, pad_id=0, pad_to_multiple=8)
    return objective.loss(model, batch, ref, objective.totals(records))


def test_kto_with_the_policy_as_reference_is_half_the_weights():
    # r = 0 and z0 = 0 everywhere: each example loses λ_y σ(0) = λ_y / 2; mean over (desirable, undesirable).
    model = build_model(SPEC)
    out = run("kto", [a_pair()], model, model, kto={"desirable_weight": 2.0, "undesirable_weight": 1.0})
    assert out.loss.item() == pytest.approx((2 * 0.5 + 1 * 0.5) / 2, abs=1e-6) and out.metrics["kl"] == 0.0
    with pytest.raises(ValueError, match="z0 is estimated over the update's pairs"):
        objectives.get("kto")(AlgorithmConfig(objective="kto")).loss(model, None, model, None)


def test_simpo_and_orpo_objectives_match_independent_log_probs():
    model, pair = build_model(SPEC), a_pair()
    chosen = behaviour_logprobs(pair.prompt_tokens, pair.chosen_tokens, model)  # per token, computed apart
    rejected = behaviour_logprobs(pair.prompt_tokens, pair.rejected_tokens, model)
    mc, mr = sum(chosen) / len(chosen), sum(rejected) / len(rejected)
    simpo = run("simpo", [pair], model, simpo={"beta": 2.0, "gamma": 0.5})
    assert simpo.loss.item() == pytest.approx(math.log(1 + math.exp(-(2.0 * (mc - mr) - 0.5))), rel=1e-5)
    lo = lambda m: m - math.log(1 - math.exp(m))
    orpo = run("orpo", [pair], model, orpo={"odds_ratio_weight": 0.25})
    want = -mc + 0.25 * math.log(1 + math.exp(-(lo(mc) - lo(mr))))  # NLL of y_w's tokens + λ L_OR
    assert orpo.loss.item() == pytest.approx(want, rel=1e-5)
    assert not objectives.get("simpo")(AlgorithmConfig()).needs_reference
    assert not objectives.get("orpo")(AlgorithmConfig()).needs_reference


def trl_dpo(chosen_logps, rejected_logps, ref_chosen_logps, ref_rejected_logps, chosen_mask, rejected_mask,
            chosen_per_token_logps, beta, loss_types, loss_weights):
    """TRL 1.16's DPOTrainer loss for loss types "sigmoid_norm" and "sft" (the reverse-KL f-divergence):
    Σ_k w_k · mean over the batch of each type's per-sequence loss."""
    chosen_scores, rejected_scores = chosen_logps - ref_chosen_logps, rejected_logps - ref_rejected_logps
    loss = 0.0
    for loss_type, weight in zip(loss_types, loss_weights):
        if loss_type == "sigmoid_norm":
            delta = chosen_scores / chosen_mask.sum(dim=1).clamp(min=1.0) - rejected_scores / rejected_mask.sum(dim=1).clamp(min=1.0)
            per_sequence_loss = -F.logsigmoid(beta * delta)
        elif loss_type == "sft":
            per_sequence_loss = (-chosen_per_token_logps[chosen_mask.bool()].mean()).expand(chosen_logps.shape[0])
        loss = loss + weight * per_sequence_loss.mean()
    return loss


def test_dpo_sigmoid_norm_and_sft_match_trl_in_value_and_gradient():
    from undertow.trainer.algorithms import dpo_loss, preference_losses

    g = torch.Generator().manual_seed(3)
    chosen_tokens = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3  # per-token log-probs, [P, T]
    rejected_tokens = -torch.rand(4, 6, generator=g, dtype=torch.float64) * 3
    chosen_mask = (torch.arange(6) < torch.tensor([[6], [2], [4], [1]])).double()  # lengths 6, 2, 4, 1
    rejected_mask = (torch.arange(6) < torch.tensor([[3], [6], [1], [5]])).double()
    refs = (-torch.rand(4, generator=g, dtype=torch.float64) * 8, -torch.rand(4, generator=g, dtype=torch.float64) * 8)
    beta, alpha = 0.3, 0.5

    def ours_of(c, r):
        summed_c, summed_r = (c * chosen_mask).sum(-1), (r * rejected_mask).sum(-1)
        out = dpo_loss(summed_c, summed_r, *refs, beta=beta, loss=preference_losses.resolve("sigmoid_norm").bind(),
                       lengths=(chosen_mask.sum(-1), rejected_mask.sum(-1)))
        return out.loss + alpha * -summed_c.sum() / chosen_mask.sum()

    c1, r1 = chosen_tokens.clone().requires_grad_(True), rejected_tokens.clone().requires_grad_(True)
    c2, r2 = chosen_tokens.clone().requires_grad_(True), rejected_tokens.clone().requires_grad_(True)
    ours = ours_of(c1, r1)
    trl = trl_dpo((c2 * chosen_mask).sum(-1), (r2 * rejected_mask).sum(-1), *refs, chosen_mask, rejected_mask, c2,
                  beta, ["sigmoid_norm", "sft"], [1.0, alpha])
    (ours + trl).backward()  # the two graphs share nothing: each gets its own gradient
    assert ours.item() == pytest.approx(trl.item(), rel=1e-12)
    torch.testing.assert_close(c1.grad, c2.grad, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(r1.grad, r2.grad, rtol=1e-12, atol=1e-15)
    # By hand for one pair: log-ratios 1.2 over 3 tokens and −0.4 over 2: m̄ = 0.4 + 0.2 = 0.6.
    one = lambda v: torch.tensor([v], dtype=torch.float64)
    out = dpo_loss(one(1.2), one(-0.4), one(0.0), one(0.0), beta=1.0, loss=preference_losses.resolve("sigmoid_norm").bind(),
                   lengths=(one(3.0), one(2.0)))
    assert out.loss.item() == pytest.approx(math.log(1 + math.exp(-0.6))) and out.reward_margin == pytest.approx(0.6)


def test_the_dpo_objective_with_sft_matches_independent_log_probs():
    model, ref, pair = policy(), build_model(SPEC).double(), a_pair()
    lp = lambda m, response: sum(behaviour_logprobs(pair.prompt_tokens, response, m))
    c, r = lp(model, pair.chosen_tokens), lp(model, pair.rejected_tokens)
    margin = (c - lp(ref, pair.chosen_tokens)) / len(pair.chosen_tokens) - (r - lp(ref, pair.rejected_tokens)) / len(pair.rejected_tokens)
    out = run("dpo", [pair], model, ref, dpo_beta=0.5, **RPO)
    want = math.log(1 + math.exp(-0.5 * margin)) + 0.5 * -c / len(pair.chosen_tokens)
    assert out.loss.item() == pytest.approx(want, rel=1e-6)
    assert out.parts["loss"] == pytest.approx(out.parts["preference_loss"] + 0.5 * out.parts["nll_loss"])


def varied_pairs(n: int = 6, seed: int = 0) -> list[PreferencePair]:
    import random

    rng = random.Random(seed)
    tokens = lambda lo, hi: [rng.randrange(4, 60) for _ in range(rng.randint(lo, hi))]
    return [PreferencePair(pair_id=f"p{i}", task_id=f"t{i}", prompt_tokens=tokens(2, 6), chosen_tokens=tokens(1, 7),
                           rejected_tokens=tokens(1, 7)) for i in range(n)]


def _double(batch):
    batch.sequences.mask = batch.sequences.mask.double()
    return batch


def policy():
    """A policy other than the reference (seed 0), on whose mismatched pairs the KL estimate is positive."""
    return build_model(SPEC.model_copy(update={"seed": 1})).double()


def grads(model) -> dict[str, torch.Tensor]:
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


RPO = {"preference_loss": "sigmoid_norm", "dpo_sft_weight": 0.5}  # DPO on per-token margins, plus the chosen NLL


@pytest.mark.parametrize("name, extra", [("dpo", {}), ("dpo", RPO), ("kto", {}), ("simpo", {}), ("orpo", {})],
                         ids=["dpo", "dpo-sigmoid_norm-sft", "kto", "simpo", "orpo"])
def test_micro_batches_and_ranks_add_up_to_the_one_pass_in_fp64(name, extra):
    from undertow.trainer.step import StepShape, Tally, accumulate, plan

    records, ref = varied_pairs(), build_model(SPEC).double()
    objective = objectives.get(name)(AlgorithmConfig(objective=name, kto={"beta": 0.5}, **extra))
    one = policy()
    whole = objective.loss(one, _double(objective.collate(records, pad_id=0, pad_to_multiple=1)), ref,
                           objective.totals(records))
    whole.loss.backward()
    expected = grads(one)
    shape = StepShape(micro_batch_tokens=24, pad_to_multiple=1)
    assert len(plan(records, objective, shape, 0, 1)[0].micro) >= 3
    for world in (1, 2):
        loss, per_rank = 0.0, []
        for rank in range(world):
            model = policy()
            (update,) = plan(records, objective, shape, rank, world)
            batches = [_double(objective.collate(m or records[:1], pad_id=0, pad_to_multiple=1)) for m in update.micro]
            tally = Tally()
            accumulate(model, objective, update, batches, ref, world, lambda loss: loss.backward(), tally)
            loss += tally.parts["loss"]
            per_rank.append(grads(model))
        assert loss == pytest.approx(whole.loss.item(), abs=1e-9), world
        for k in expected:
            torch.testing.assert_close(sum(g[k] for g in per_rank) / world, expected[k], atol=1e-9, rtol=1e-6)


def test_kto_takes_z0_from_the_whole_update_and_again_on_each_pass():
    records, ref = varied_pairs(), build_model(SPEC).double()
    kto = objectives.get("kto")(AlgorithmConfig(objective="kto"))
    model = policy()
    batch = lambda rs: _double(kto.collate(rs, pad_id=0, pad_to_multiple=1))
    whole = kto.loss(model, batch(records), ref, kto.totals(records)).metrics["kl"]
    halves = [kto.loss(model, batch(h), ref, kto.totals(h)).metrics["kl"] for h in (records[:3], records[3:])]
    # The seed-1 policy against the seed-0 reference makes the update's z0 positive and each half's different: had z0 been taken
    # per micro-batch, the sums above would not match.
    assert whole > 0 and len({round(whole, 9), *(round(h, 9) for h in halves)}) == 3
    chunked = objectives.get("kto")(AlgorithmConfig(objective="kto", kto={"kl_chunk": 5}))  # 12 sequences: 3 forwards
    records_batch = _double(chunked.collate(records, pad_id=0, pad_to_multiple=1))
    assert chunked.loss(model, records_batch, ref, chunked.totals(records)).metrics["kl"] == pytest.approx(whole, abs=1e-9)
    totals, first = kto.totals(records), batch(records[:3])
    second = batch(records[3:])
    z = [kto.loss(model, b, ref, totals).metrics["kl"] for b in (first, second)]
    assert z == [pytest.approx(whole, abs=1e-12)] * 2
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)  # the optimizer stepped: the next pass over the same batches needs a new z0
    again = kto.loss(model, first, ref, totals).metrics["kl"]
    assert again != pytest.approx(whole, abs=1e-6)
