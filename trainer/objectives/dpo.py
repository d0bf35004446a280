"""Preference pairs (DPO and its losses): the policy's log-ratio margin to a reference."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from undertow.trainer.algorithms import Totals, dpo_loss, masked, preference_losses
from undertow.trainer.batch import PairBatch

from .api import PairObjective, StepLoss, objectives, reference_logprobs, summed_logprobs

if TYPE_CHECKING:
    from undertow.trainer.config import AlgorithmConfig


@objectives.register("dpo")
class DPOObjective(PairObjective):
    """A preference loss on pairs (DPO's sigmoid by default; `preference_loss`: robust, hinge, ipo);
    reference log-probs from the records, else from the reference model."""

    needs_reference: ClassVar[bool] = True

    def __init__(self, algo: "AlgorithmConfig"):
        self.beta, self.temperature = algo.dpo_beta, algo.temperature
        self.preference_loss = preference_losses.resolve(algo.preference_loss).bind()

    def loss(self, model: Any, batch: PairBatch, ref_model: Any = None, totals: Totals | None = None) -> StepLoss:
        seqs, n = batch.sequences, batch.pairs
        summed, _ = summed_logprobs(model, seqs, self.temperature)  # [2P]
        ref = batch.ref_logp
        if ref is None:
            ref = masked(reference_logprobs(ref_model, seqs, self.temperature), seqs.mask).sum(-1)  # [2P]
        out = dpo_loss(summed[:n], summed[n:], ref[:n], ref[n:], beta=self.beta, loss=self.preference_loss)
        loss = out.loss * n / (totals.sequences if totals else n)  # the mean over the step's pairs
        return StepLoss(loss, {"reward_margin": out.reward_margin, "preference_accuracy": out.accuracy},
                        {"loss": loss.item()})
