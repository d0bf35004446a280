"""What one optimizer step minimises: RL on experiences, SFT on experiences, DPO on preference pairs.

Each objective turns records into tensors (`collate`) and tensors into a loss (`loss`). Log-probs
come from `schemas.logprobs.sequence_logprobs`, the definition the rollout engines use too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from kernel.registry import Registry
from schemas import Experience, PreferencePair, Record
from schemas.logprobs import sequence_logprobs

from .algorithms import PolicyInputs, aggregations, dpo_loss, entropy, kl_estimators, masked_mean, policy_losses
from .algorithms.sft import sft_token_loss
from .batch import PairBatch, SequenceBatch, collate_experiences, collate_pairs

if TYPE_CHECKING:
    from .config import AlgorithmConfig

objectives: Registry = Registry("objective")


@dataclass
class StepLoss:
    """The scalar to backpropagate and what to log about it."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


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
class RLObjective:
    """Policy loss + optional KL (as loss term or advantage penalty) − entropy bonus."""

    record_type: ClassVar[type[Record]] = Experience
    checks_staleness: ClassVar[bool] = True

    def __init__(self, algo: "AlgorithmConfig"):
        self.policy_loss = policy_losses.resolve(algo.policy_loss)
        self.aggregate = aggregations.resolve(algo.aggregation)
        self.kl = kl_estimators.resolve(algo.kl.estimator)
        self.kl_coef, self.kl_placement = algo.kl.coef, algo.kl.placement
        self.entropy_coef, self.temperature = algo.entropy_coef, algo.temperature

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    def collate(self, records: list[Experience], *, pad_id: int, pad_to_multiple: int) -> SequenceBatch:
        return collate_experiences(records, pad_id=pad_id, pad_to_multiple=pad_to_multiple)

    def _agg(self, token_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.aggregate.obj(token_values, mask, **self.aggregate.kwargs)

    def loss(self, model: Any, batch: SequenceBatch, ref_model: Any = None) -> StepLoss:
        logp, logits = policy_logprobs(model, batch, self.temperature)  # [B, T-1], [B, T-1, V]
        mask, advantages = batch.mask, batch.advantages
        kl_tokens = None
        if self.needs_reference:
            ref_logp = reference_logprobs(ref_model, batch, self.temperature)  # [B, T-1]
            kl_tokens = self.kl.obj(logp, ref_logp) * mask
            if self.kl_placement == "reward":  # a per-token reward penalty, folded into the advantage
                advantages = advantages - self.kl_coef * kl_tokens.detach()
        inputs = PolicyInputs(mask=mask, advantages=advantages, behaviour_logp=batch.behaviour_logp,
                              proximal_logp=logp.detach())
        out = self.policy_loss.obj(inputs, logp, **self.policy_loss.kwargs)
        policy = self._agg(out.token_loss, mask)
        loss = policy
        ent = entropy(logits, self.temperature) * mask  # [B, T-1]
        if self.entropy_coef:
            loss = loss - self.entropy_coef * self._agg(ent, mask)
        metrics = {"policy_loss": policy.item(), "entropy": masked_mean(ent.detach(), mask).item(), **out.metrics}
        if kl_tokens is not None:
            kl_term = self._agg(kl_tokens, mask)
            if self.kl_placement == "loss":
                loss = loss + self.kl_coef * kl_term
            metrics["kl"] = masked_mean(kl_tokens.detach(), mask).item()
        metrics["loss"] = loss.item()
        return StepLoss(loss, metrics)


@objectives.register("sft")
class SFTObjective:
    """Negative log-likelihood of the (masked) response tokens; offline, so no staleness check."""

    record_type: ClassVar[type[Record]] = Experience
    checks_staleness: ClassVar[bool] = False
    needs_reference: ClassVar[bool] = False

    def __init__(self, algo: "AlgorithmConfig"):
        self.aggregate = aggregations.resolve(algo.aggregation)
        self.temperature = algo.temperature

    def collate(self, records: list[Experience], *, pad_id: int, pad_to_multiple: int) -> SequenceBatch:
        return collate_experiences(records, pad_id=pad_id, pad_to_multiple=pad_to_multiple)

    def loss(self, model: Any, batch: SequenceBatch, ref_model: Any = None) -> StepLoss:
        logp, _ = policy_logprobs(model, batch, self.temperature)
        loss = self.aggregate.obj(sft_token_loss(logp, batch.mask), batch.mask, **self.aggregate.kwargs)
        return StepLoss(loss, {"loss": loss.item(), "nll": masked_mean(-logp.detach(), batch.mask).item()})


@objectives.register("dpo")
class DPOObjective:
    """DPO on preference pairs; reference log-probs from the records, else from the reference model."""

    record_type: ClassVar[type[Record]] = PreferencePair
    checks_staleness: ClassVar[bool] = False
    needs_reference: ClassVar[bool] = True

    def __init__(self, algo: "AlgorithmConfig"):
        self.beta, self.temperature = algo.dpo_beta, algo.temperature

    def collate(self, records: list[PreferencePair], *, pad_id: int, pad_to_multiple: int) -> PairBatch:
        return collate_pairs(records, pad_id=pad_id, pad_to_multiple=pad_to_multiple)

    def loss(self, model: Any, batch: PairBatch, ref_model: Any = None) -> StepLoss:
        seqs, n = batch.sequences, batch.pairs
        logp, _ = policy_logprobs(model, seqs, self.temperature)
        summed = (logp * seqs.mask).sum(-1)  # [2P]
        ref = batch.ref_logp
        if ref is None:
            ref = (reference_logprobs(ref_model, seqs, self.temperature) * seqs.mask).sum(-1)  # [2P]
        out = dpo_loss(summed[:n], summed[n:], ref[:n], ref[n:], beta=self.beta)
        return StepLoss(out.loss, {"loss": out.loss.item(), "reward_margin": out.reward_margin,
                                   "preference_accuracy": out.accuracy})
