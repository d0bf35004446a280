"""What one optimizer step minimises: RL on experiences, SFT on experiences, DPO on preference pairs.

Each objective turns records into tensors (`collate`), says how long each record's sequences are
(`lengths`, for micro-batch packing) and what normalises a step (`totals`), and turns tensors into
a loss (`loss`) aggregated against the step's totals, so that the losses of a step's micro-batches
add up to the loss of the step in one pass. Log-probs come from `schemas.logprobs.sequence_logprobs`,
the definition the rollout engines use too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

import torch

from undertow.kernel.registry import Registry
from undertow.schemas import Experience, PreferencePair, Record
from undertow.schemas.logprobs import sequence_logprobs

from .algorithms import (PolicyInputs, Totals, aggregations, dpo_loss, entropy, kl_estimators, masked, masked_mean,
                         policy_losses, preference_losses)
from .algorithms.sft import sft_token_loss
from .batch import PairBatch, SequenceBatch, collate_experiences, collate_pairs

if TYPE_CHECKING:
    from .config import AlgorithmConfig



class Objective(Protocol):
    """What the step loop asks of an objective (one registered in `objectives`, built from the
    algorithm config): which records it trains on and whether staleness bounds them, whether it
    needs the frozen reference model, and how records become micro-batches and a loss."""

    record_type: ClassVar[type[Record]]
    checks_staleness: ClassVar[bool]
    importance_sampled: ClassVar[bool]  # weighs by ratios to the behaviour log-probs the rollout recorded

    @property
    def needs_reference(self) -> bool: ...

    def collate(self, records: list[Any], *, pad_id: int, pad_to_multiple: int) -> Any: ...

    def lengths(self, record: Any) -> list[int]: ...

    def totals(self, records: list[Any]) -> Totals: ...

    def logprobs(self, model: Any, batch: Any) -> torch.Tensor | None: ...

    def loss(self, model: Any, batch: Any, ref_model: Any = None, totals: Totals | None = None) -> "StepLoss": ...


objectives: Registry[Callable[["AlgorithmConfig"], Objective]] = Registry("objective")


@dataclass
class StepLoss:
    """The scalar to backpropagate (normalised by the step's totals), its parts (which add up over
    micro-batches like the loss) and means over this batch's tokens (weighted by them)."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)
    parts: dict[str, float] = field(default_factory=dict)


def trained_tokens(e: Experience) -> int:
    return int(sum(e.loss_mask)) if e.loss_mask else len(e.response_tokens)


class _ExperienceObjective:
    """Records are experiences: one sequence each, normalised by their trained tokens."""

    record_type: ClassVar[type[Record]] = Experience

    def collate(self, records: list[Experience], *, pad_id: int, pad_to_multiple: int) -> SequenceBatch:
        return collate_experiences(records, pad_id=pad_id, pad_to_multiple=pad_to_multiple)

    def lengths(self, record: Experience) -> list[int]:
        return [len(record.prompt_tokens) + len(record.response_tokens)]

    def totals(self, records: list[Experience]) -> Totals:
        return Totals(float(sum(trained_tokens(e) for e in records)), len(records))

    def logprobs(self, model: Any, batch: SequenceBatch) -> torch.Tensor:
        """Log-probs of the batch under `model`, without gradient: the proximal policy's."""
        with torch.no_grad():
            return sequence_logprobs(model, batch.input_ids, batch.attention_mask, self.temperature)


class _KeepLogits:
    """Calls the model and keeps its logits, so entropy needs no second forward pass."""

    def __init__(self, model: Any):
        self.model, self.logits = model, None

    def __call__(self, **inputs: Any) -> Any:
        out = self.model(**inputs)
        self.logits = out.logits
        return out


def policy_logprobs(model: Any, batch: SequenceBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [B, T-1], logits [B, T-1, V]) of the batch under `model`."""
    keep = _KeepLogits(model)
    logp = sequence_logprobs(keep, batch.input_ids, batch.attention_mask, temperature)
    return logp, keep.logits[:, :-1]


def reference_logprobs(ref_model: Any, batch: SequenceBatch, temperature: float) -> torch.Tensor:
    with torch.no_grad():
        return sequence_logprobs(ref_model, batch.input_ids, batch.attention_mask, temperature)


@objectives.register("rl")
class RLObjective(_ExperienceObjective):
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


@objectives.register("sft")
class SFTObjective(_ExperienceObjective):
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
