"""KTO on preference pairs (trainer/algorithms/kto.py): each pair gives a desirable example (the
chosen answer) and an undesirable one (the rejected answer), weighed λ_D and λ_U around z0.

z0, the reference point, is a batch statistic: estimated once per optimizer update over the whole
update's records (every rank's share: every rank holds the whole batch), never per micro-batch, so
that the micro-batches' losses add up exactly to the loss of the update in one pass. The update's
records travel in its totals (`KTOTotals`); the first micro-batch of a pass computes z0 with
no-grad forwards of the policy and the reference over the 2P mismatched sequences (`kto.kl_chunk`
at a time: the same number of forwards on every rank, as ZeRO-3 needs) and the rest reuse it. A batch seen again means a new pass over the
update (another PPO epoch, with new weights): z0 is computed again. Every rank computes the same z0
from the same records: world_size times the work of TRL's gathered mean, and no collective.

Pairs only: an unpaired labelled example would need a record type the trainer does not read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from undertow.kernel.lazy import torch

from undertow.schemas import PreferencePair
from undertow.trainer.algorithms import Totals, masked
from undertow.trainer.algorithms.kto import kto_loss, reference_point, rotated
from undertow.trainer.batch import PairBatch, pack_sequences

from .api import PairObjective, StepLoss, objectives, reference_logprobs, summed_logprobs

if TYPE_CHECKING:
    from undertow.trainer.config import AlgorithmConfig


@dataclass(frozen=True)
class KTOTotals(Totals):
    """The update's normalisers, its pairs (for z0) and z0 once computed for the current pass."""

    records: tuple[PreferencePair, ...] = ()
    cache: dict = field(default_factory=dict, compare=False, repr=False)


def mismatched(records: tuple[PreferencePair, ...]) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, responses) of the KL examples: the 2P examples (chosen answers, then rejected ones),
    each prompt with the response of the example before it."""
    prompts = [r.prompt_tokens for r in records] * 2
    responses = [r.chosen_tokens for r in records] + [r.rejected_tokens for r in records]
    return prompts, [responses[j] for j in rotated(len(responses))]


@objectives.register("kto")
class KTOObjective(PairObjective):
    """mean over examples of λ_y (1 − σ(±β (r_θ − z0))), r_θ the summed log-ratio to the reference."""

    needs_reference: ClassVar[bool] = True

    def __init__(self, algo: "AlgorithmConfig"):
        kto = algo.kto
        self.beta, self.weights, self.temperature = kto.beta, (kto.desirable_weight, kto.undesirable_weight), algo.temperature
        self.chunk = kto.kl_chunk
        self.padding = (0, 8)  # (pad id, multiple), as the step's collate last used them

    def collate(self, records: list[PreferencePair], *, pad_id: int, pad_to_multiple: int) -> PairBatch:
        self.padding = (pad_id, pad_to_multiple)
        return super().collate(records, pad_id=pad_id, pad_to_multiple=pad_to_multiple)

    def totals(self, records: list[PreferencePair]) -> KTOTotals:
        base = super().totals(records)
        return KTOTotals(base.tokens, base.sequences, tuple(records))

    def z0(self, model: Any, ref_model: Any, totals: KTOTotals, batch: PairBatch) -> torch.Tensor:
        """The update's reference point, computed on the first batch of each pass over it."""
        cache = totals.cache
        if "z0" not in cache or id(batch) in cache["seen"]:
            cache["z0"], cache["seen"] = self._estimate(model, ref_model, totals.records, batch), set()
        cache["seen"].add(id(batch))
        return cache["z0"]

    def _estimate(self, model: Any, ref_model: Any, records: tuple[PreferencePair, ...], batch: PairBatch) -> torch.Tensor:
        prompts, responses = mismatched(records)
        chunk, device = self.chunk, batch.sequences.input_ids.device
        policy, ref = [], []
        with torch.no_grad():
            for i in range(0, len(prompts), chunk):
                seqs = pack_sequences(prompts[i:i + chunk], responses[i:i + chunk], pad_id=self.padding[0],
                                      pad_to_multiple=self.padding[1])
                seqs.input_ids, seqs.attention_mask = seqs.input_ids.to(device), seqs.attention_mask.to(device)
                seqs.mask = seqs.mask.to(device)
                policy.append(summed_logprobs(model, seqs, self.temperature)[0])  # [n]
                ref.append(masked(reference_logprobs(ref_model, seqs, self.temperature), seqs.mask).sum(-1))  # [n]
        return reference_point(torch.cat(policy), torch.cat(ref).to(policy[0].dtype))  # scalar

    def loss(self, model: Any, batch: PairBatch, ref_model: Any = None, totals: Totals | None = None) -> StepLoss:
        if not isinstance(totals, KTOTotals):
            raise ValueError("kto: z0 is estimated over the update's pairs; pass totals=objective.totals(records)")
        seqs, n = batch.sequences, batch.pairs
        summed, _ = summed_logprobs(model, seqs, self.temperature)  # [2P]
        ref = batch.ref_logp
        if ref is None:
            ref = masked(reference_logprobs(ref_model, seqs, self.temperature), seqs.mask).sum(-1)  # [2P]
        logratio = summed - ref.to(summed.dtype)  # [2P]: r_θ of the chosen rows, then the rejected
        z0 = self.z0(model, ref_model, totals, batch)
        out = kto_loss(logratio[:n], logratio[n:], z0, beta=self.beta, desirable_weight=self.weights[0],
                       undesirable_weight=self.weights[1])
        loss = out.losses.sum() / (2 * totals.sequences)  # the mean over the update's 2P examples
        r = logratio.detach()
        metrics = {"kl": out.z0, "reward_margin": out.reward_margin, "preference_accuracy": out.accuracy,
                   "chosen_reward": r[:n].mean().item(), "rejected_reward": r[n:].mean().item()}
        return StepLoss(loss, metrics, {"loss": loss.item()})
