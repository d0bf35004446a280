"""SimPO on preference pairs: a length-normalised margin of the policy alone (trainer/algorithms/simpo.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from undertow.trainer.algorithms import Totals
from undertow.trainer.algorithms.simpo import simpo_loss
from undertow.trainer.batch import PairBatch

from .api import PairObjective, StepLoss, objectives, summed_logprobs

if TYPE_CHECKING:
    from undertow.trainer.config import AlgorithmConfig


@objectives.register("simpo")
class SimPOObjective(PairObjective):
    """−log σ(β (mean log π(y_w) − mean log π(y_l)) − γ), averaged over the step's pairs; no reference model."""

    needs_reference: ClassVar[bool] = False

    def __init__(self, algo: "AlgorithmConfig"):
        self.beta, self.gamma, self.temperature = algo.simpo.beta, algo.simpo.gamma, algo.temperature

    def loss(self, model: Any, batch: PairBatch, ref_model: Any = None, totals: Totals | None = None) -> StepLoss:
        n = batch.pairs
        summed, lengths = summed_logprobs(model, batch.sequences, self.temperature)  # [2P], [2P]
        out = simpo_loss(summed[:n], summed[n:], lengths[:n], lengths[n:], beta=self.beta, gamma=self.gamma)
        loss = out.losses.sum() / (totals.sequences if totals else n)  # the mean over the step's pairs
        return StepLoss(loss, {"reward_margin": out.reward_margin, "preference_accuracy": out.accuracy},
                        {"loss": loss.item()})
