"""A step cut into micro-batches and ranks computes the loss and gradient of the step in one pass."""

from __future__ import annotations

import random

import pytest
import torch

from undertow.kernel.models import build_model
from undertow.schemas import Experience
from undertow.trainer.config import AlgorithmConfig
from undertow.trainer.objectives import objectives
from undertow.trainer.step import StepShape, Tally, accumulate, pack, padded_cost, plan, prepare_step

from .helpers import SPEC

AGGREGATIONS = ["token_mean", "seq_mean_token_sum", "seq_mean_token_mean", {"name": "seq_mean_token_sum_norm", "max_tokens": 12}]


def varied_experiences(n: int = 8, seed: int = 0) -> list[Experience]:
    """Prompts and responses of different lengths, some tokens masked out, advantages of both signs,
    behaviour log-probs far enough from the model's that PPO's clip binds on some tokens."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randrange(4, 60) for _ in range(rng.randint(2, 7))]
        response = [rng.randrange(4, 60) for _ in range(rng.randint(1, 9))]
        mask = [int(rng.random() > 0.2) for _ in response]
        out.append(Experience(experience_id=f"e{i}", task_id="t", group_id=f"g{i // 4}", group_size=4,
                              sample_index=i % 4, prompt_tokens=prompt, response_tokens=response, loss_mask=mask,
                              behaviour_logprobs=[-3.9 + rng.uniform(-0.6, 0.6) for _ in response],
                              advantages=[rng.uniform(-2, 2)] * len(response), reward=0.0,
                              policy_version=0, finish_reason="stop"))
    return out


def gradients(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def run_ranks(objective, records, shape: StepShape, world_size: int, ref) -> tuple[float, dict[str, torch.Tensor]]:
    """Each simulated rank accumulates its micro-batches into its own copy; the ranks' gradients are
    then averaged, which is what DeepSpeed's all-reduce does."""
    losses, grads = 0.0, []
    for rank in range(world_size):
        model = build_model(SPEC).double()
        (update,) = plan(records, objective, shape, rank, world_size)
        batches = [objective.collate(m or records[:1], pad_id=0, pad_to_multiple=shape.pad_to_multiple)
                   for m in update.micro]
        batches = [_double(b) for b in batches]
        tally = Tally()
        accumulate(model, objective, update, batches, ref, world_size, lambda loss: loss.backward(), tally)
        losses += tally.parts["loss"]
        grads.append(gradients(model))
    return losses, {k: sum(g[k] for g in grads) / world_size for k in grads[0]}


def _double(batch):
    for name in ("mask", "behaviour_logp", "advantages"):
        setattr(batch, name, getattr(batch, name).double())
    return batch


@pytest.mark.parametrize("aggregation", AGGREGATIONS, ids=lambda a: a if isinstance(a, str) else a["name"])
def test_one_pass_four_micro_batches_and_two_ranks_agree_in_fp64(aggregation):
    records = varied_experiences()
    ref = build_model(SPEC.model_copy(update={"seed": 1})).double()
    algo = AlgorithmConfig(aggregation=aggregation, entropy_coef=0.01, kl={"coef": 0.1, "estimator": "k3"})
    rl = objectives.get("rl")(algo)

    one = build_model(SPEC).double()
    whole = _double(rl.collate(records, pad_id=0, pad_to_multiple=1))
    loss = rl.loss(one, whole, ref).loss
    loss.backward()
    expected = gradients(one)

    budget = 30  # packs these 8 sequences (4 to 14 tokens) into exactly 4 micro-batches on one rank
    shape = StepShape(micro_batch_tokens=budget, pad_to_multiple=1)
    assert len(plan(records, rl, shape, 0, 1)[0].micro) == 4
    two_by_two = [len(plan(records, rl, StepShape(micro_batch_tokens=30, pad_to_multiple=1), r, 2)[0].micro)
                  for r in range(2)]
    assert two_by_two == [2, 2]
    for world, s in ((1, shape), (2, StepShape(micro_batch_tokens=30, pad_to_multiple=1))):
        got_loss, got = run_ranks(rl, records, s, world, ref)
        assert got_loss == pytest.approx(loss.item(), abs=1e-9)
        for k in expected:
            torch.testing.assert_close(got[k], expected[k], atol=1e-9, rtol=1e-6)


def test_packing_respects_the_budget_and_pads_ranks_to_the_same_count():
    records = varied_experiences(9)
    rl = objectives.get("rl")(AlgorithmConfig())
    for micro in pack(records, rl, 40, 8):
        assert len(micro) == 1 or padded_cost([n for r in micro for n in rl.lengths(r)], 8) <= 40
    assert pack(records, rl, None, 8) == [records]
    shape = StepShape(micro_batch_tokens=40, mini_batches=2)
    updates = [plan(records, rl, shape, r, 2) for r in range(2)]
    assert [len(u) for u in updates] == [2, 2]
    for i in range(2):
        assert len(updates[0][i].micro) == len(updates[1][i].micro)
        seen = [r.experience_id for rank in range(2) for m in updates[rank][i].micro for r in m]
        assert sorted(seen) == sorted(r.experience_id for r in updates[0][i].records)
    assert sum(len(u.records) for u in updates[0]) == 9


@pytest.mark.parametrize("transform, kl", [("reinforce_pp", {"coef": 0.1, "estimator": "k1", "placement": "reward"}),
                                           ("batch_whiten", {"coef": 0.1, "estimator": "k3", "placement": "reward"}),
                                           ("batch_whiten", {"coef": 0.1, "estimator": "k2", "placement": "loss"})])
def test_an_advantage_transform_over_the_whole_batch_is_the_same_however_the_step_is_cut(transform, kl):
    """REINFORCE++'s whitening needs the whole step's tokens: it runs once, before the cut, its
    reference forward passes within the micro-batch budget; cut or not, ranks or not, the same
    advantages, loss and gradient."""
    records = [r.model_copy(update={"reward": float(i % 3)}) for i, r in enumerate(varied_experiences())]
    ref = build_model(SPEC.model_copy(update={"seed": 1})).double()
    rl = objectives.get("rl")(AlgorithmConfig(advantage_transform=transform, kl=kl, entropy_coef=0.01))
    collate = lambda multiple: lambda rs: _double(rl.collate(rs, pad_id=0, pad_to_multiple=multiple))
    whole, metrics = prepare_step(rl, records, ref, StepShape(pad_to_multiple=1), collate(1))
    cut, _ = prepare_step(rl, records, ref, StepShape(micro_batch_tokens=30, pad_to_multiple=8), collate(8))
    assert [r.experience_id for r in cut] == [r.experience_id for r in records]
    for a, b in zip(whole, cut):
        assert a.advantages == pytest.approx(b.advantages, abs=1e-9)
    trained = torch.tensor([a for e in whole for a, m in zip(e.advantages, e.loss_mask) if m], dtype=torch.float64)
    assert trained.mean().item() == pytest.approx(0.0, abs=1e-9) and trained.std().item() == pytest.approx(1.0, abs=1e-6)
    assert ("kl" in metrics) == (kl["placement"] == "reward")  # folded up front, reported by the step

    one = build_model(SPEC).double()
    out = rl.loss(one, collate(1)(whole), ref)
    assert ("kl" in out.metrics) == (kl["placement"] == "loss")  # the loss does not fold it a second time
    out.loss.backward()
    expected = gradients(one)
    for world in (1, 2):
        got_loss, got = run_ranks(rl, cut, StepShape(micro_batch_tokens=30, pad_to_multiple=1), world, ref)
        assert got_loss == pytest.approx(out.loss.item(), abs=1e-9)
        for k in expected:
            torch.testing.assert_close(got[k], expected[k], atol=1e-9, rtol=1e-6)


def test_without_a_transform_the_step_is_not_prepared():
    records = varied_experiences()
    rl = objectives.get("rl")(AlgorithmConfig())
    assert prepare_step(rl, records, None, StepShape(), lambda rs: 1 / 0) == (records, {})
