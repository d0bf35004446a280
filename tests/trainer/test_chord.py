"""CHORD: expert demonstrations mixed into RL steps. μ's schedule and φ by hand, the mixed loss against
its two parts computed apart, micro-batches and ranks against one pass, and config errors."""

from __future__ import annotations

import math
from dataclasses import fields

import pytest
import torch

from undertow.kernel.models import build_model
from undertow.schemas import Experience
from undertow.schemas.logprobs import sequence_logprobs
from undertow.trainer.algorithms import Totals
from undertow.trainer.config import AlgorithmConfig, MixingConfig, TrainerConfig
from undertow.trainer.objectives import objectives
from undertow.trainer.objectives.chord import ChordObjective, MixedBatch, as_expert, is_expert, mu_at, phi_token_loss
from undertow.trainer.step import StepShape, Tally, accumulate, plan

from .helpers import SPEC
from .test_step import gradients, varied_experiences


def demonstrations(n: int = 3) -> list[Experience]:
    """Expert answers as `undertow load` writes them: no behaviour log-probs, no advantages."""
    return [as_expert(Experience(experience_id=f"x{i}", task_id=f"x{i}", group_id=f"x{i}", prompt_tokens=[7, 8 + i],
                                 response_tokens=[20 + i] * (i + 2), policy_version=0, finish_reason="stop"))
            for i in range(n)]


def test_mu_rises_over_the_warm_up_then_decays_on_a_cosine_to_its_valley():
    cfg = MixingConfig(expert_per_step=4, mu_peak=0.5, mu_valley=0.1, mu_warmup_steps=10, mu_decay_steps=20)
    # warm-up: 0.5·s/10; decay: 0.1 + 0.4·½(1 + cos(π s/20)) at s = 0, 10, 20 → 0.5, 0.3, 0.1
    assert [mu_at(s, cfg) for s in (0, 5, 10, 20, 30, 99)] == pytest.approx([0.0, 0.25, 0.5, 0.3, 0.1, 0.1])
    assert mu_at(1000, MixingConfig(expert_per_step=1, mu_peak=0.2, mu_valley=0.0)) == 0.2  # no decay: the peak


def test_phi_weighs_the_nll_by_p_times_one_minus_p():
    logp = torch.log(torch.tensor([[0.5, 0.9, 0.1]]))
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    # φ(0.5) = 0.25, φ(0.9) = 0.09: 0.25·ln 2 = 0.173287, 0.09·(−ln 0.9) = 0.0094824; the masked token is 0
    assert phi_token_loss(logp, mask, phi=True)[0].tolist() == pytest.approx([0.173287, 0.0094824, 0.0], abs=1e-6)
    assert phi_token_loss(logp, mask, phi=False)[0].tolist() == pytest.approx([math.log(2), -math.log(0.9), 0.0])
    logp.requires_grad_(True)
    phi_token_loss(logp, mask, phi=True).sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-0.25, -0.09, 0.0])  # φ is detached: the gradient is −φ


def test_the_mixed_loss_is_one_minus_mu_rl_plus_mu_sft_each_over_its_own_tokens():
    usual, expert = varied_experiences(6), demonstrations()
    algo = AlgorithmConfig()
    rl = objectives.get("rl")(algo)
    chord = ChordObjective(rl, MixingConfig(expert_per_step=3, mu_peak=0.3), algo.temperature)
    chord.begin_step(0)
    model = build_model(SPEC).double()
    records = usual[:3] + expert + usual[3:]
    out = chord.loss(model, double(chord.collate(records, pad_id=0, pad_to_multiple=1)), None, chord.totals(records))

    rl_loss = rl.loss(model, double(rl.collate(usual, pad_id=0, pad_to_multiple=1)), None, rl.totals(usual)).loss
    nll, tokens = 0.0, 0
    for e in expert:  # SFT-φ by hand, one demonstration at a time
        ids = torch.tensor([e.prompt_tokens + e.response_tokens])
        logp = sequence_logprobs(model, ids, torch.ones_like(ids))[0, len(e.prompt_tokens) - 1:].double()
        p = logp.exp()
        nll += float((-logp * p * (1 - p)).sum())
        tokens += len(e.response_tokens)
    assert out.loss.item() == pytest.approx(0.7 * rl_loss.item() + 0.3 * nll / tokens, abs=1e-9)
    assert out.metrics["mu"] == 0.3 and out.parts["sft_loss"] == pytest.approx(nll / tokens, abs=1e-9)
    assert [is_expert(r) for r in records].count(True) == 3


def test_micro_batches_and_two_ranks_train_what_one_pass_does():
    records = varied_experiences(8) + demonstrations(4)
    algo = AlgorithmConfig(entropy_coef=0.01)
    chord = ChordObjective(objectives.get("rl")(algo), MixingConfig(expert_per_step=4, mu_peak=0.4), algo.temperature)
    one = build_model(SPEC).double()
    chord.loss(one, double(chord.collate(records, pad_id=0, pad_to_multiple=1)), None, chord.totals(records)).loss.backward()
    expected = gradients(one)
    for world in (1, 2):
        shape = StepShape(micro_batch_tokens=30, pad_to_multiple=1)
        grads = []
        for rank in range(world):
            model = build_model(SPEC).double()
            (update,) = plan(records, chord, shape, rank, world)
            assert len(update.micro) >= 2
            batches = [double(chord.collate(m or records[:1], pad_id=0, pad_to_multiple=1)) for m in update.micro]
            accumulate(model, chord, update, batches, None, world, lambda loss: loss.backward(), Tally())
            grads.append(gradients(model))
        for k in expected:
            torch.testing.assert_close(sum(g[k] for g in grads) / world, expected[k], atol=1e-9, rtol=1e-6)


def test_mixing_needs_experiences_and_no_advantage_transform():
    with pytest.raises(ValueError, match="mixing: .*'dpo' trains on other records"):
        TrainerConfig.model_validate({"mixing": {"expert_per_step": 2}, "algorithm": {"objective": "dpo"}})
    with pytest.raises(ValueError, match="mixing: an advantage_transform"):
        TrainerConfig.model_validate({"mixing": {"expert_per_step": 2},
                                      "algorithm": {"advantage_transform": "batch_whiten"}})
    with pytest.raises(ValueError, match="expert_per_step"):
        TrainerConfig.model_validate({"mixing": {"mu_peak": 0.2}})


def double(batch):
    """A batch (mixed or not) with its float tensors in fp64."""
    for part in (batch.usual, batch.expert) if isinstance(batch, MixedBatch) else (batch,):
        for f in fields(part) if part is not None else ():
            value = getattr(part, f.name)
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                setattr(part, f.name, value.double())
    return batch


def test_totals_count_each_part_apart():
    chord = ChordObjective(objectives.get("rl")(AlgorithmConfig()), MixingConfig(expert_per_step=1))
    usual, expert = varied_experiences(2), demonstrations(2)
    totals = chord.totals(usual + expert)
    assert totals.expert == Totals(float(2 + 3), 2) and totals.usual.sequences == 2
    assert totals.tokens == totals.usual.tokens + 5
