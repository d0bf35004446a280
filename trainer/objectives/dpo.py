"""Preference pairs (DPO and its losses): the policy's log-ratio margin to a reference."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from undertow.schemas import PreferencePair, Record
from undertow.trainer.algorithms import Totals, dpo_loss, masked, preference_losses
from undertow.trainer.batch import PairBatch, collate_pairs

from .api import StepLoss, objectives, policy_logprobs, reference_logprobs

if TYPE_CHECKING:
    from undertow.trainer.config import AlgorithmConfig


@objectives.register("dpo")
class DPOObjective:
    """A preference loss on pairs (DPO's sigmoid by default; `preference_loss`: robust, hinge, ipo);
    reference log-probs from the records, else from the reference model."""

    record_type: ClassVar[type[Record]] = PreferencePair
    checks_staleness: ClassVar[bool] = False
    importance_sampled: ClassVar[bool] = False
    needs_reference: ClassVar[bool] = True

    def __init__(self, algo: "AlgorithmConfig"):
        self.beta, self.temperature = algo.dpo_beta, algo.temperature
        self.preference_loss = preference_losses.resolve(algo.preference_loss).bind()

    def collate(self, records: list[PreferencePair], *, pad_id: int, pad_to_multiple: int) -> PairBatch:
        return collate_pairs(records, pad_id=pad_id, pad_to_multiple=pad_to_multiple)

    def lengths(self, record: PreferencePair) -> list[int]:
        p = len(record.prompt_tokens)
        return [p + len(record.chosen_tokens), p + len(record.rejected_tokens)]

    def totals(self, records: list[PreferencePair]) -> Totals:
        return Totals(float(sum(len(r.chosen_tokens) + len(r.rejected_tokens) for r in records)), len(records))

    def logprobs(self, model: Any, batch: PairBatch) -> None:
        return None  # DPO has no proximal policy

    def loss(self, model: Any, batch: PairBatch, ref_model: Any = None, totals: Totals | None = None) -> StepLoss:
        seqs, n = batch.sequences, batch.pairs
        logp, _ = policy_logprobs(model, seqs, self.temperature)
        summed = masked(logp, seqs.mask).sum(-1)  # [2P]
        ref = batch.ref_logp
        if ref is None:
            ref = masked(reference_logprobs(ref_model, seqs, self.temperature), seqs.mask).sum(-1)  # [2P]
        out = dpo_loss(summed[:n], summed[n:], ref[:n], ref[n:], beta=self.beta, loss=self.preference_loss)
        loss = out.loss * n / (totals.sequences if totals else n)  # the mean over the step's pairs
        return StepLoss(loss, {"reward_margin": out.reward_margin, "preference_accuracy": out.accuracy},
                        {"loss": loss.item()})
