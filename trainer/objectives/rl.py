"""RL on experiences: a policy loss (trainer/algorithms), an optional KL to a reference (as a loss term
or an advantage penalty) and an entropy bonus, aggregated against the step's totals."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import torch

from undertow.trainer.algorithms import (PolicyInputs, Totals, aggregations, entropy, kl_estimators, masked,
                                         masked_mean, policy_losses)
from undertow.trainer.batch import SequenceBatch

from .api import ExperienceObjective, StepLoss, objectives, policy_logprobs, reference_logprobs

if TYPE_CHECKING:
    from undertow.trainer.config import AlgorithmConfig


@objectives.register("rl")
class RLObjective(ExperienceObjective):
    """Policy loss + optional KL (as loss term or advantage penalty) − entropy bonus."""

    checks_staleness: ClassVar[bool] = True
    importance_sampled: ClassVar[bool] = True

    def __init__(self, algo: "AlgorithmConfig"):
        self.policy_loss = policy_losses.resolve(algo.policy_loss)
        self.aggregate = aggregations.resolve(algo.aggregation)
        self.kl = kl_estimators.resolve(algo.kl.estimator)
        self.kl_coef, self.kl_placement = algo.kl.coef, algo.kl.placement
        self.entropy_coef, self.temperature = algo.entropy_coef, algo.temperature

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def _agg(self, token_values: torch.Tensor, mask: torch.Tensor, totals: Totals | None) -> torch.Tensor:
        return self.aggregate.obj(token_values, mask, totals, **self.aggregate.kwargs)

    def loss(self, model: Any, batch: SequenceBatch, ref_model: Any = None, totals: Totals | None = None) -> StepLoss:
        logp, logits = policy_logprobs(model, batch, self.temperature)  # [B, T-1], [B, T-1, V]
        mask, advantages = batch.mask, batch.advantages
        kl_tokens = None
        if self.needs_reference:
            ref_logp = reference_logprobs(ref_model, batch, self.temperature)  # [B, T-1]
            kl_tokens = masked(self.kl.obj(logp, ref_logp), mask)
            if self.kl_placement == "reward":  # a per-token reward penalty, folded into the advantage
                advantages = advantages - self.kl_coef * kl_tokens.detach()
        proximal = batch.proximal_logp if batch.proximal_logp is not None else logp.detach()
        inputs = PolicyInputs(mask=mask, advantages=advantages, behaviour_logp=batch.behaviour_logp,
                              proximal_logp=proximal)
        out = self.policy_loss.obj(inputs, logp, **self.policy_loss.kwargs)
        policy = self._agg(out.token_loss, mask, totals)
        loss = policy
        ent = masked(entropy(logits, self.temperature), mask)  # [B, T-1]
        if self.entropy_coef:
            loss = loss - self.entropy_coef * self._agg(ent, mask, totals)
        metrics = {"entropy": masked_mean(ent.detach(), mask).item(), **out.metrics}
        if kl_tokens is not None:
            kl_term = self._agg(kl_tokens, mask, totals)
            if self.kl_placement == "loss":
                loss = loss + self.kl_coef * kl_term
            metrics["kl"] = masked_mean(kl_tokens.detach(), mask).item()
        return StepLoss(loss, metrics, {"loss": loss.item(), "policy_loss": policy.item()})
