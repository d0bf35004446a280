"""SFT on experiences: the negative log-likelihood of the trained response tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from undertow.trainer.algorithms import Totals, aggregations, masked_mean, sft_token_loss
from undertow.trainer.batch import SequenceBatch

from .api import ExperienceObjective, StepLoss, objectives, policy_logprobs

if TYPE_CHECKING:
    from undertow.trainer.config import AlgorithmConfig


@objectives.register("sft")
class SFTObjective(ExperienceObjective):
    """Negative log-likelihood of the (masked) response tokens; offline, so no staleness check."""

    checks_staleness: ClassVar[bool] = False
    importance_sampled: ClassVar[bool] = False
    needs_reference: ClassVar[bool] = False

    def __init__(self, algo: "AlgorithmConfig"):
        self.aggregate = aggregations.resolve(algo.aggregation)
        self.temperature = algo.temperature

    def loss(self, model: Any, batch: SequenceBatch, ref_model: Any = None, totals: Totals | None = None) -> StepLoss:
        logp, _ = policy_logprobs(model, batch, self.temperature)
        loss = self.aggregate.obj(sft_token_loss(logp, batch.mask), batch.mask, totals, **self.aggregate.kwargs)
        return StepLoss(loss, {"nll": masked_mean(-logp.detach(), batch.mask).item()}, {"loss": loss.item()})
