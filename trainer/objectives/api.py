"""What every objective shares: the contract the step loop asks of one, its registry, its result, and
the log-probs of a batch.

Each objective turns records into tensors (`collate`), says how long each record's sequences are
(`lengths`, for micro-batch packing) and what normalises a step (`totals`), and turns tensors into
a loss (`loss`) aggregated against the step's totals, so that the losses of a step's micro-batches
add up to the loss of the step in one pass. Log-probs come from `schemas.logprobs.sequence_logprobs`,
the definition the rollout engines use too, with the rows' shared prompt run once (`SharedPrefix`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

from undertow.kernel.lazy import torch

from undertow.kernel.registry import Registry
from undertow.schemas import Experience, PreferencePair, Record
from undertow.schemas.logprobs import sequence_logprobs
from undertow.trainer.algorithms import Totals, entropy, masked
from undertow.trainer.batch import PairBatch, SequenceBatch, collate_experiences, collate_pairs

from .shared_prefix import SharedPrefix

if TYPE_CHECKING:
    from undertow.trainer.config import AlgorithmConfig


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


class ExperienceObjective:
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
        return reference_logprobs(model, batch, self.temperature)


class PairObjective:
    """Records are preference pairs: two sequences each (the batch's chosen rows first), normalised by
    pairs; offline, so no staleness bound and no proximal policy."""

    record_type: ClassVar[type[Record]] = PreferencePair
    checks_staleness: ClassVar[bool] = False
    importance_sampled: ClassVar[bool] = False

    def collate(self, records: list[PreferencePair], *, pad_id: int, pad_to_multiple: int) -> PairBatch:
        return collate_pairs(records, pad_id=pad_id, pad_to_multiple=pad_to_multiple)

    def lengths(self, record: PreferencePair) -> list[int]:
        p = len(record.prompt_tokens)
        return [p + len(record.chosen_tokens), p + len(record.rejected_tokens)]

    def totals(self, records: list[PreferencePair]) -> Totals:
        return Totals(float(sum(len(r.chosen_tokens) + len(r.rejected_tokens) for r in records)), len(records))

    def logprobs(self, model: Any, batch: PairBatch) -> None:
        return None  # no proximal policy: nothing is importance-weighted


def summed_logprobs(model: Any, seqs: SequenceBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-probs [N], response tokens [N]) of each sequence under `model`, with gradient."""
    logp, _ = policy_logprobs(model, seqs, temperature)  # [N, T-1]
    return masked(logp, seqs.mask).sum(-1), seqs.mask.sum(-1)


class _KeepLogits:
    """Calls the model and keeps its logits, so entropy needs no second forward pass."""

    def __init__(self, model: Any):
        self.model, self.logits = model, None

    def __call__(self, **inputs: Any) -> Any:
        out = self.model(**inputs)
        self.logits = out.logits
        return out


def first_trained_column(mask: torch.Tensor) -> int:
    """The first column any row trains on ([B, T-1] mask): the columns before it need no logits."""
    trained = mask.any(0).nonzero()
    return int(trained[0]) if len(trained) else 0


def policy_logprobs(model: Any, batch: SequenceBatch, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-probs [B, T-1], logits [B, T-1-f, V] of the columns from f = the first trained one) of the
    batch under `model`; the columns before f, which no row trains on, get log-prob 0 and no logits."""
    keep = _KeepLogits(SharedPrefix(model))
    logp = sequence_logprobs(keep, batch.input_ids, batch.attention_mask, temperature,
                             first=first_trained_column(batch.mask))
    return logp, keep.logits[:, :-1]


def column_entropy(logits: torch.Tensor, temperature: float, width: int) -> torch.Tensor:
    """Entropy per column [B, width] from `policy_logprobs`' logits (0 in the columns they skip)."""
    ent = entropy(logits, temperature)  # [B, width - f]
    return torch.nn.functional.pad(ent, (width - ent.shape[1], 0))


def reference_logprobs(ref_model: Any, batch: SequenceBatch, temperature: float) -> torch.Tensor:
    """Log-probs [B, T-1] of the batch under a model that is not trained here (the reference, or the
    policy's weights before a step's first update), without gradient."""
    with torch.no_grad():
        return sequence_logprobs(SharedPrefix(ref_model), batch.input_ids, batch.attention_mask, temperature,
                                 first=first_trained_column(batch.mask))
