"""The shared prompt run once (trainer/objectives/shared_prefix.py) gives the full rows' logits and
gradient, and forwards fewer tokens: checked against the plain forward pass on the tiny model."""

from __future__ import annotations

import pytest
import torch

from undertow.kernel.models import build_model
from undertow.schemas.logprobs import position_ids, sequence_logprobs
from undertow.trainer.batch import pack_sequences
from undertow.trainer.objectives.api import first_trained_column
from undertow.trainer.objectives.shared_prefix import MIN_PREFIX, SharedPrefix, common_prefix

from .helpers import SPEC

SYSTEM = list(range(10, 40))  # a chat template's system turn: 30 tokens every prompt starts with


def rows(prompts: list[list[int]], responses: list[list[int]]):
    return pack_sequences(prompts, responses, pad_id=0, pad_to_multiple=8)


class Counting:
    """The model, counting the token positions it is given."""

    def __init__(self, model):
        self.model, self.positions = model, 0

    def __call__(self, **kw):
        self.positions += kw["input_ids"].numel()
        return self.model(**kw)


def logprobs_and_grads(model, batch, wrap):
    model.zero_grad()
    logp = sequence_logprobs(wrap(model), batch.input_ids, batch.attention_mask, 0.7, first=first_trained_column(batch.mask))
    weights = torch.linspace(-1, 2, logp.numel()).reshape(logp.shape)  # an advantage-like weighting per token
    (logp * batch.mask * weights).sum().backward()
    return logp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("case", ["one group", "two prompts, one system turn"])
def test_the_shared_prompt_gives_the_full_rows_log_probs_and_gradient_with_fewer_positions(case):
    torch.manual_seed(0)
    model = build_model(SPEC).train()
    question = [[50, 51, 52, 53, 54], [60, 61, 62]]
    prompts = [SYSTEM + question[0]] * 4 if case == "one group" else [SYSTEM + question[i % 2] for i in range(4)]
    responses = [[70, 71, 2], [72, 2], [73, 74, 75, 76, 2], [77, 78, 79, 80, 81, 82, 83]]  # right-padded to 8s
    batch = rows(prompts, responses)
    shared_len = len(prompts[0]) if case == "one group" else len(SYSTEM)
    assert common_prefix(batch.input_ids, batch.attention_mask) == shared_len

    full_logp, full_grads = logprobs_and_grads(model, batch, lambda m: m)
    counted = []
    shared_logp, shared_grads = logprobs_and_grads(model, batch, lambda m: counted.append(Counting(m)) or SharedPrefix(counted[-1]))
    # float32 over a few hundred accumulations in another order: agreement to ~1e-6 of the values' size
    assert torch.allclose(shared_logp, full_logp, rtol=0, atol=1e-5), (shared_logp - full_logp).abs().max()
    assert full_grads.keys() == shared_grads.keys()
    for name, g in full_grads.items():
        assert torch.allclose(shared_grads[name], g, rtol=1e-4, atol=1e-6 * g.abs().max().item()), name
    b, width = batch.input_ids.shape
    assert counted[0].positions == shared_len + b * (width - shared_len) < b * width


def test_it_runs_the_full_rows_where_sharing_cannot_apply():
    model = build_model(SPEC)
    short = rows([[5, 6, 7]] * 3, [[8, 2], [9, 2], [10, 11, 2]])  # a prefix under MIN_PREFIX
    alone = rows([SYSTEM], [[8, 2]])  # one row
    for batch, keep in ((short, 5), (alone, 3), (rows([SYSTEM] * 2, [[8, 2], [9, 2]]), 0)):  # 0: every column's logits
        counting = Counting(model)
        ids, mask = batch.input_ids, batch.attention_mask
        out = SharedPrefix(counting)(input_ids=ids, attention_mask=mask, position_ids=position_ids(mask), logits_to_keep=keep)
        assert counting.positions == ids.numel() and out.logits.shape[1] == (keep or ids.shape[1])
    assert common_prefix(short.input_ids, short.attention_mask) < MIN_PREFIX
