"""The critic of PPO: a value model trained beside the policy by a DeepSpeed engine of its own.

It is a separate model, not a head on the policy's trunk: the policy's weights, its LoRA adapters,
the reference model and weight publishing stay exactly as without a critic (only the policy is
published; the critic never leaves the trainer, but is checkpointed with it). The value model is the
policy's architecture from the same ModelSpec (its initial weights, or `trainer.critic.init_from`'s)
without the vocabulary head, and a scalar head on the last hidden state: one value per token.

    V_φ(s_t) = w · h_t + b        h_t the last hidden state at position t   [B, T]
The value of response token j (prompt of length P) is read at position P−1+j, the state it is
generated from: the same column as its log-prob. The head starts at 0 (so does every first value).

The step loop uses it twice: once per step over the whole batch (`values`, for GAE in the policy
objective's prepare pass), and in every update beside the policy (`loss`: PPO2's clipped value loss
aggregated like the policy's, against the same step totals), after which both engines step.
"""

from __future__ import annotations

from typing import Any

import torch

from undertow.kernel.models import ModelSpec, build_model
from undertow.schemas.logprobs import position_ids

from .algorithms import Totals, aggregations, clipped_value_loss
from .batch import SequenceBatch
from .config import TrainerConfig
from .engine import Process, wrap_engine
from .objectives.api import StepLoss, trained_tokens
from .optim import finite_guard


class ValueModel(torch.nn.Module):
    """A causal LM's trunk (without its vocabulary head) and a scalar head: input_ids [B, T] -> values [B, T]."""

    def __init__(self, lm: Any):
        super().__init__()
        self.trunk = lm.base_model  # the transformer below the LM head (GPT-2's `transformer`, Llama's `model`)
        self.head = torch.nn.Linear(lm.config.hidden_size, 1, dtype=lm.dtype)
        torch.nn.init.zeros_(self.head.weight)
        torch.nn.init.zeros_(self.head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = self.trunk(input_ids=input_ids, attention_mask=attention_mask,
                            position_ids=position_ids(attention_mask)).last_hidden_state  # [B, T, H]
        return self.head(hidden).squeeze(-1)  # [B, T]


def value_model(spec: ModelSpec, init_from: str | None = None) -> ValueModel:
    """The value model of `spec`: its initial weights (spec.init_from's), or `init_from`'s (an HF export
    directory or .safetensors of the same architecture) under a fresh head."""
    lm = build_model(spec if init_from is None else spec.model_copy(update={"init_from": init_from}))
    return ValueModel(lm)


class Critic:
    """The value model (a DeepSpeed engine; a plain module in tests) and its loss settings. `loss` and
    `totals` have the objective's signatures, so the step loop accumulates it like the policy."""

    def __init__(self, model: Any, *, aggregation: Any = "token_mean", value_clip: float | None = 0.2,
                 vf_coef: float = 1.0):
        self.model, self.value_clip, self.vf_coef = model, value_clip, vf_coef
        self.aggregate = aggregations.resolve(aggregation)

    def values(self, batch: SequenceBatch) -> torch.Tensor:
        """V(s_t) of every column, without gradient: [B, T-1], aligned with the log-probs."""
        with torch.no_grad():
            return self.model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)[:, :-1]

    def totals(self, records: list[Any]) -> Totals:
        """The normalisers of records: their trained tokens and count, as the policy objective's."""
        return Totals(float(sum(trained_tokens(e) for e in records)), len(records))

    def loss(self, model: Any, batch: SequenceBatch, ref_model: Any = None, totals: Totals | None = None) -> StepLoss:
        """The clipped value loss of this micro-batch, aggregated against the update's totals."""
        if batch.returns is None or batch.old_values is None:
            raise ValueError("critic: the batch has no returns; the step's prepare pass (gae) computes them")
        values = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)[:, :-1]  # [B, T-1]
        values = values.to(batch.returns.dtype)
        out = clipped_value_loss(values, batch.old_values, batch.returns, batch.mask, self.value_clip)
        value_loss = self.aggregate.obj(out.token_loss, batch.mask, totals, **self.aggregate.kwargs)
        return StepLoss(self.vf_coef * value_loss, out.metrics, {"value_loss": value_loss.item()})

    def step(self) -> bool:
        """The critic engine's optimizer step; whether it changed the weights (a non-finite one does not)."""
        guard = finite_guard(self.model)
        guard.applied = False
        self.model.step()
        return guard.applied


def build_critic(spec: ModelSpec, cfg: TrainerConfig, process: Process) -> Critic | None:
    """The critic of `cfg.critic` in its own DeepSpeed engine (the policy's engine settings, the
    critic's learning rate); None without one."""
    if cfg.critic is None:
        return None
    torch.manual_seed(cfg.engine.seed)
    model = value_model(spec, cfg.critic.init_from).to(process.device).train()
    if cfg.gradient_checkpointing:
        model.trunk.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.trunk.config.use_cache = False
    engine = wrap_engine(model, cfg.engine.model_copy(update={"lr": cfg.critic.lr}), process)
    return Critic(engine, aggregation=cfg.algorithm.aggregation, value_clip=cfg.critic.value_clip,
                  vf_coef=cfg.critic.vf_coef)
