"""Preference pairs (DPO and its losses): the policy's log-ratio margin to a reference, and optionally
the chosen answers' NLL beside it (DPO + SFT: TRL's loss_type ["sigmoid", "sft"], RPO of Pang et al.
2024, "Iterative Reasoning Preference Optimization"):
    L = L_pref(m) + α · (−Σ log π_θ(y_w) / Σ |y_w|)       the NLL a token mean over the chosen answers
Its totals count the chosen tokens (`tokens`, the NLL's normaliser) and the pairs (`sequences`), so
micro-batch losses add up to the step's."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from undertow.schemas import PreferencePair
from undertow.trainer.algorithms import Totals, dpo_loss, masked, preference_losses
from undertow.trainer.batch import PairBatch

from .api import PairObjective, StepLoss, objectives, reference_logprobs, summed_logprobs

if TYPE_CHECKING:
    from undertow.trainer.config import AlgorithmConfig


@objectives.register("dpo")
class DPOObjective(PairObjective):
    """A preference loss on pairs (DPO's sigmoid by default; `preference_loss`: robust, hinge, ipo,
    sigmoid_norm), plus `dpo_sft_weight` times the chosen answers' NLL; reference log-probs from the
    records, else from the reference model."""

    needs_reference: ClassVar[bool] = True

    def __init__(self, algo: "AlgorithmConfig"):
        self.beta, self.temperature, self.sft_weight = algo.dpo_beta, algo.temperature, algo.dpo_sft_weight
        component = preference_losses.resolve(algo.preference_loss)
        self.per_token = getattr(component.obj, "per_token", False)  # a user's loss may ask for m̄ too
        self.preference_loss = component.bind()

    def totals(self, records: list[PreferencePair]) -> Totals:
        return Totals(float(sum(len(r.chosen_tokens) for r in records)), len(records))

    def loss(self, model: Any, batch: PairBatch, ref_model: Any = None, totals: Totals | None = None) -> StepLoss:
        seqs, n = batch.sequences, batch.pairs
        summed, lengths = summed_logprobs(model, seqs, self.temperature)  # [2P], [2P]
        ref = batch.ref_logp
        if ref is None:
            ref = masked(reference_logprobs(ref_model, seqs, self.temperature), seqs.mask).sum(-1)  # [2P]
        out = dpo_loss(summed[:n], summed[n:], ref[:n], ref[n:], beta=self.beta, loss=self.preference_loss,
                       lengths=(lengths[:n], lengths[n:]) if self.per_token else None)
        preference = out.loss * n / (totals.sequences if totals else n)  # the mean over the step's pairs
        parts = {"loss": preference.item()}
        loss = preference
        if self.sft_weight > 0:
            chosen_tokens = totals.tokens if totals else lengths[:n].sum().clamp(min=1)
            nll = -summed[:n].sum() / chosen_tokens  # this batch's share of the step's token-mean NLL
            loss = preference + self.sft_weight * nll
            parts = {"loss": loss.item(), "preference_loss": preference.item(), "nll_loss": nll.item()}
        return StepLoss(loss, {"reward_margin": out.reward_margin, "preference_accuracy": out.accuracy}, parts)
