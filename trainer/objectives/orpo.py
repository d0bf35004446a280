"""ORPO on preference pairs: the chosen answers' NLL plus λ times the odds-ratio loss
(trainer/algorithms/orpo.py); no reference model.

Its totals count the chosen tokens only (`tokens`), since the NLL is a token mean over them, and
the pairs (`sequences`), which L_OR is averaged over: so micro-batch losses add up to the step's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from undertow.schemas import PreferencePair
from undertow.trainer.algorithms import Totals
from undertow.trainer.algorithms.orpo import odds_ratio_loss
from undertow.trainer.algorithms.simpo import length_normalised
from undertow.trainer.batch import PairBatch

from .api import PairObjective, StepLoss, objectives, summed_logprobs

if TYPE_CHECKING:
    from undertow.trainer.config import AlgorithmConfig


@objectives.register("orpo")
class ORPOObjective(PairObjective):
    """L_SFT(y_w) + λ · −log σ(log odds(y_w) − log odds(y_l))."""

    needs_reference: ClassVar[bool] = False

    def __init__(self, algo: "AlgorithmConfig"):
        self.weight, self.temperature = algo.orpo.odds_ratio_weight, algo.temperature

    def totals(self, records: list[PreferencePair]) -> Totals:
        return Totals(float(sum(len(r.chosen_tokens) for r in records)), len(records))

    def loss(self, model: Any, batch: PairBatch, ref_model: Any = None, totals: Totals | None = None) -> StepLoss:
        n = batch.pairs
        summed, lengths = summed_logprobs(model, batch.sequences, self.temperature)  # [2P], [2P]
        chosen_tokens = totals.tokens if totals else lengths[:n].sum().clamp(min=1)
        pairs = totals.sequences if totals else n
        nll = -summed[:n].sum() / chosen_tokens  # this batch's share of the step's token-mean NLL
        mean_logp = length_normalised(summed, lengths)  # [2P]
        out = odds_ratio_loss(mean_logp[:n], mean_logp[n:])
        odds = out.or_losses.sum() / pairs  # this batch's share of the mean over the step's pairs
        loss = nll + self.weight * odds
        metrics = {"log_odds_ratio": out.log_odds_ratio, "preference_accuracy": out.accuracy,
                   "nll": (-summed[:n].detach().sum() / lengths[:n].sum().clamp(min=1)).item()}
        return StepLoss(loss, metrics, {"loss": loss.item(), "nll_loss": nll.item(), "odds_ratio_loss": odds.item()})
