"""PPO's critic in the step (trainer/critic.py): its values computed once over the whole batch give the
same GAE advantages and returns however the step is cut, and its clipped value loss accumulated over
micro-batches and ranks has the loss and gradient of one pass, in fp64; the config names its errors."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from undertow.kernel.models import build_model, weights_to_bytes
from undertow.trainer.batch import ValuedExperience
from undertow.trainer.config import AlgorithmConfig, TrainerConfig
from undertow.trainer.critic import Critic, value_model
from undertow.trainer.objectives import objectives
from undertow.trainer.step import StepShape, Tally, accumulate, plan, prepare_step

from .helpers import SPEC
from .test_step import gradients, varied_experiences


def critic_model(seed: int) -> torch.nn.Module:
    """A value model whose head reads the trunk (the zero-initialised head would hide the trunk's gradient)."""
    torch.manual_seed(seed)
    model = value_model(SPEC).double()
    torch.nn.init.normal_(model.head.weight, std=0.5)
    return model


def double(batch):
    for name in ("mask", "behaviour_logp", "advantages", "returns", "old_values"):
        if getattr(batch, name) is not None:
            setattr(batch, name, getattr(batch, name).double())
    return batch


def prepared(aggregation: str, micro_batch_tokens: int | None, multiple: int):
    records = [r.model_copy(update={"reward": float(i % 3)}) for i, r in enumerate(varied_experiences())]
    ref = build_model(SPEC.model_copy(update={"seed": 1})).double()
    rl = objectives.get("rl")(AlgorithmConfig(aggregation=aggregation, advantage_transform={"name": "gae", "lam": 0.9},
                                              kl={"coef": 0.1, "estimator": "k1", "placement": "reward"}))
    old = Critic(critic_model(1), aggregation=aggregation, value_clip=0.2)
    collate = lambda rs: double(rl.collate(rs, pad_id=0, pad_to_multiple=multiple))
    out, metrics = prepare_step(rl, records, ref, StepShape(micro_batch_tokens, pad_to_multiple=multiple), collate, old)
    return rl, old, out, metrics


@pytest.mark.parametrize("aggregation", ["token_mean", "seq_mean_token_mean"])
def test_the_critic_cut_into_micro_batches_and_ranks_trains_what_one_pass_does(aggregation):
    rl, old, whole, metrics = prepared(aggregation, None, 1)
    _, _, cut, _ = prepared(aggregation, 30, 8)
    assert all(isinstance(e, ValuedExperience) for e in whole)
    assert [e.experience_id for e in cut] == [e.experience_id for e in whole]
    for a, b in zip(whole, cut):
        for name in ("advantages", "returns", "values"):
            assert getattr(a, name) == pytest.approx(getattr(b, name), abs=1e-9)
    assert {"value_mean", "returns_mean", "explained_variance", "kl"} <= set(metrics)
    one = double(rl.collate(whole, pad_id=0, pad_to_multiple=1))
    # The old values the batch carries sit where the critic reads them: V(s_t) in the log-prob's column.
    torch.testing.assert_close(one.old_values * one.mask, old.values(one) * one.mask, atol=1e-6, rtol=0)

    new = Critic(critic_model(2), aggregation=aggregation, value_clip=0.2)  # moved away from the old one: clips
    out = new.loss(new.model, one)
    assert 0.05 < out.metrics["vf_clip_fraction"] < 0.95
    out.loss.backward()
    expected = gradients(new.model)
    assert any(k.startswith("trunk.") and v.abs().sum() > 0 for k, v in expected.items())
    shape = StepShape(micro_batch_tokens=30, pad_to_multiple=1)
    for world in (1, 2):
        loss, grads = 0.0, []
        for rank in range(world):
            critic = Critic(critic_model(2), aggregation=aggregation, value_clip=0.2)
            (update,) = plan(cut, rl, shape, rank, world)
            assert len(update.micro) == (4 if world == 1 else 2)
            batches = [double(rl.collate(m or cut[:1], pad_id=0, pad_to_multiple=1)) for m in update.micro]
            tally = Tally()
            accumulate(critic.model, critic, update, batches, None, world, lambda l: l.backward(), tally)
            loss += tally.parts["value_loss"]
            grads.append(gradients(critic.model))
        assert loss == pytest.approx(out.parts["value_loss"], abs=1e-9)
        for k in expected:
            torch.testing.assert_close(sum(g[k] for g in grads) / world, expected[k], atol=1e-9, rtol=1e-6)


def test_the_value_model_starts_at_zero_and_has_the_policys_trunk():
    model, policy = value_model(SPEC), build_model(SPEC)
    ids = torch.tensor([[5, 6, 7, 8]])
    values = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    assert values.shape == (1, 4) and values.abs().max().item() == 0.0
    trunk = {k: v for k, v in policy.state_dict().items() if k.startswith("transformer.")}
    assert {f"trunk.{k[len('transformer.'):]}" for k in trunk} <= set(model.state_dict())
    assert all(torch.equal(model.state_dict()[f"trunk.{k[len('transformer.'):]}"], v) for k, v in trunk.items())


def test_the_critic_can_start_from_other_weights(tmp_path):
    other = build_model(SPEC.model_copy(update={"seed": 3}))
    (tmp_path / "other.safetensors").write_bytes(weights_to_bytes(other))
    model = value_model(SPEC, str(tmp_path / "other.safetensors"))
    expected = other.state_dict()["transformer.h.0.attn.c_attn.weight"]
    assert torch.equal(model.state_dict()["trunk.h.0.attn.c_attn.weight"], expected)
    assert not torch.equal(value_model(SPEC).state_dict()["trunk.h.0.attn.c_attn.weight"], expected)


def test_config_errors_name_the_field():
    with pytest.raises(ValidationError, match="critic: the advantage_transform gae needs a critic"):
        TrainerConfig.model_validate({"algorithm": {"advantage_transform": {"name": "gae", "lam": 1.0}}})
    with pytest.raises(ValidationError, match="critic: nothing reads the critic's values"):
        TrainerConfig.model_validate({"critic": {"lr": 1e-5}, "algorithm": {"advantage_transform": "batch_whiten"}})
    with pytest.raises(ValidationError, match="critic.value_clip"):
        TrainerConfig.model_validate({"critic": {"value_clip": -1}, "algorithm": {"advantage_transform": "gae"}})
    cfg = TrainerConfig.model_validate({"critic": {"lr": 1e-5}, "algorithm": {"advantage_transform": "gae"}})
    assert cfg.critic.lr == 1e-5 and cfg.critic.value_clip == 0.2
