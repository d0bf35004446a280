"""Objectives on the tiny model without DeepSpeed: tensor alignment, RL at ratio 1, SFT, DPO, config errors."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError

from undertow.kernel.models import build_model
from undertow.schemas import PreferencePair
from undertow.schemas.logprobs import sequence_logprobs
from undertow.trainer.batch import pack_sequences
from undertow.infra.run.config import RunConfig
from undertow.trainer.config import AlgorithmConfig
from undertow.trainer.objectives import objectives

from .helpers import SPEC, make_group


def test_response_tokens_land_where_sequence_logprobs_predicts_them():
    b = pack_sequences([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], pad_id=0, pad_to_multiple=8,
                       advantages=[[1.0, 2.0], [3.0, 4.0, 5.0]], masks=[[1, 1], [1, 0, 1]])
    assert b.input_ids.shape == (2, 8) and b.tokens == 9
    assert b.input_ids[0, :5].tolist() == [5, 6, 7, 9, 10] and b.attention_mask[0].tolist() == [1] * 5 + [0] * 3
    assert b.mask[0].tolist() == [0, 0, 1, 1, 0, 0, 0] and b.advantages[0, 2:4].tolist() == [1.0, 2.0]
    assert b.mask[1].tolist() == [1, 0, 1, 0, 0, 0, 0]  # column t predicts token t+1: 11 at 0, 13 at 2


def test_the_policy_is_projected_onto_the_vocabulary_only_where_a_row_trains():
    """The columns before the first trained one get log-prob 0 and no logits; every trained column
    is the full forward's, and the entropy is each column's own (hand: -Σ p log p of the full logits)."""
    from undertow.trainer.objectives.api import column_entropy, first_trained_column, policy_logprobs

    model = build_model(SPEC)
    b = pack_sequences([[5, 6, 7, 8, 9], [8, 4, 3]], [[9, 10], [11, 12, 13]], pad_id=0, pad_to_multiple=8)
    assert first_trained_column(b.mask) == 2  # the second row's 3-token prompt
    calls = []
    spy = lambda **kw: calls.append(kw) or model(**kw)  # noqa: E731
    logp, logits = policy_logprobs(spy, b, 1.0)
    full_logits = model(input_ids=b.input_ids, attention_mask=b.attention_mask,
                        position_ids=(b.attention_mask.cumsum(-1) - 1).clamp(min=0)).logits[:, :-1]
    full = sequence_logprobs(model, b.input_ids, b.attention_mask)
    assert calls[0]["logits_to_keep"] == 6 and logits.shape[1] == 7 - 2  # 8 positions, 2 never projected
    assert (logp[:, :2] == 0).all() and torch.allclose(logp[:, 2:], full[:, 2:], atol=1e-6)
    p = full_logits.softmax(-1)
    by_hand = -(p * p.log()).sum(-1)
    assert torch.allclose(column_entropy(logits, 1.0, 7)[:, 2:], by_hand[:, 2:], atol=1e-5)


def test_rl_on_policy_loss_is_minus_mean_advantage():
    model = build_model(SPEC)
    # Behaviour log-probs of this very model: ratio 1, so PPO's clipped surrogate is just A per token.
    advantages = [[3.0, 1.0], [1.0, 1.0], [-1.0, -1.0], [0.0, 2.0]]
    records = [r.model_copy(update={"advantages": a}) for r, a in zip(make_group("g"), advantages)]
    rl = objectives.get("rl")(AlgorithmConfig())
    out = rl.loss(model, rl.collate(records, pad_id=0, pad_to_multiple=8))
    # token_mean of -A over the 8 response tokens: -(4 + 2 - 2 + 2) / 8
    assert out.metrics["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert out.loss.item() == pytest.approx(-0.75, abs=1e-5) and out.metrics["entropy"] > 0


def test_the_entropy_bonus_lowers_the_loss_by_its_coefficient_times_the_entropy():
    model, records = build_model(SPEC), make_group("g")
    rl = lambda coef: objectives.get("rl")(AlgorithmConfig(entropy_coef=coef))
    plain, bonus = (rl(c).loss(model, rl(c).collate(records, pad_id=0, pad_to_multiple=8)) for c in (0.0, 0.01))
    assert plain.metrics["entropy"] > 1.0  # an untrained model: nearly uniform over its characters
    assert bonus.loss.item() == pytest.approx(plain.loss.item() - 0.01 * plain.metrics["entropy"], abs=1e-6)


def test_rl_with_kl_to_itself_adds_nothing_and_sft_is_nll():
    model = build_model(SPEC)
    records = make_group("g")
    algo = AlgorithmConfig(kl={"coef": 0.5, "estimator": "k3"})
    out = objectives.get("rl")(algo).loss(model, objectives.get("rl")(algo).collate(records, pad_id=0, pad_to_multiple=8), model)
    assert out.metrics["kl"] == pytest.approx(0.0, abs=1e-6)
    sft = objectives.get("sft")(AlgorithmConfig(objective="sft"))
    nll = -sum(sum(r.behaviour_logprobs) for r in records) / sum(len(r.response_tokens) for r in records)
    assert sft.loss(model, sft.collate(records, pad_id=0, pad_to_multiple=8)).loss.item() == pytest.approx(nll, rel=1e-5)


def test_dpo_with_the_policy_as_reference_is_log_two():
    model = build_model(SPEC)
    good, bad = make_group("g")[:2]
    pair = PreferencePair(pair_id="p", task_id="t", prompt_tokens=good.prompt_tokens,
                          chosen_tokens=good.response_tokens, rejected_tokens=bad.response_tokens)
    dpo = objectives.get("dpo")(AlgorithmConfig(objective="dpo"))
    assert dpo.loss(model, dpo.collate([pair], pad_id=0, pad_to_multiple=8), model).loss.item() == \
        pytest.approx(torch.log(torch.tensor(2.0)).item(), abs=1e-6)
    given = pair.model_copy(update={"chosen_ref_logprob": sum(good.behaviour_logprobs) - 2.0,
                                    "rejected_ref_logprob": sum(bad.behaviour_logprobs)})
    out = dpo.loss(model, dpo.collate([given], pad_id=0, pad_to_multiple=8))  # margin 2, β 0.1
    assert out.loss.item() == pytest.approx(-torch.nn.functional.logsigmoid(torch.tensor(0.2)).item(), abs=1e-5)


def test_bad_config_names_the_field():
    with pytest.raises(ValidationError) as e:
        RunConfig.model_validate({"trainer": {"algorithm": {"policy_loss": "ppo_clipp"}}})
    assert "trainer.algorithm.policy_loss" in str(e.value) and "ppo_clip" in str(e.value)
    with pytest.raises(ValidationError, match="eps_hi"):
        RunConfig.model_validate({"trainer": {"algorithm": {"policy_loss": {"name": "dapo", "eps_hi": 1}}}})
    with pytest.raises(ValidationError, match="offload_optimizer"):
        RunConfig.model_validate({"trainer": {"engine": {"offload_optimizer": True}}})
    with pytest.raises(ValidationError, match="chunk_bytes"):
        RunConfig.model_validate({"trainer": {"weights": {"chunk_bytes": 9 << 20}}})
    with pytest.raises(ValidationError, match="uri: transport files needs a directory"):
        RunConfig.model_validate({"trainer": {"weights": {"transport": "files"}}})
    with pytest.raises(ValidationError, match=r"feeder\.x\n  Extra inputs"):  # one model: no section goes unread
        RunConfig.model_validate({"feeder": {"x": 1}, "trainer": {}})
    assert RunConfig.model_validate({"trainer": {}}).trainer.sync_every == 1


def test_bias_corrected_kl_weighs_by_the_ratio_to_the_behaviour_policy():
    """Behaviour log-probs shifted by −0.3 nats: every token's ratio π_θ/π_behaviour is e^0.3, so TRL's
    corrected KL is e^0.3 times the plain one (and the loss term with it)."""
    model, ref = build_model(SPEC), build_model(SPEC.model_copy(update={"seed": 1}))
    records = [r.model_copy(update={"behaviour_logprobs": [lp - 0.3 for lp in r.behaviour_logprobs]})
               for r in make_group("g")]
    kl = lambda correct: objectives.get("rl")(AlgorithmConfig(kl={"coef": 0.5, "bias_correction": correct}))
    plain, corrected = (kl(c).loss(model, kl(c).collate(records, pad_id=0, pad_to_multiple=8), ref) for c in (False, True))
    assert plain.metrics["kl"] > 0.01
    assert corrected.metrics["kl"] == pytest.approx(plain.metrics["kl"] * math.exp(0.3), rel=1e-4)


def test_bad_transform_and_kl_settings_name_the_field():
    with pytest.raises(ValidationError, match=r"trainer\.algorithm\.advantage_transform[\s\S]*'reinforce_pp'"):
        RunConfig.model_validate({"trainer": {"algorithm": {"advantage_transform": "reinforce_ppp"}}})
    with pytest.raises(ValidationError, match="gama"):
        RunConfig.model_validate({"trainer": {"algorithm": {"advantage_transform": {"name": "reinforce_pp", "gama": 1}}}})
    with pytest.raises(ValidationError, match="bias_correction: weighs the KL loss term; set placement: loss"):
        RunConfig.model_validate({"trainer": {"algorithm": {"kl": {"bias_correction": True, "placement": "reward"}}}})
    assert AlgorithmConfig(kl={"estimator": "k3+"}).kl.estimator == "k3+"
