"""CHORD: expert demonstrations mixed into RL steps (Zhang et al. 2025, "On-Policy RL Meets Off-Policy
Experts: Harmonizing SFT and RL via Dynamic Weighting", arXiv 2508.11408).

A step holds the RL experiences of the ready topic and `mixing.expert_per_step` demonstrations of the
expert topic; each part is normalised by its own tokens over the whole step (so micro-batches and ranks
add up to one pass, as every objective's parts do), then

    L = (1 − μ) · L_RL(usual) + μ · L_SFT(expert)                               (eq. 5)
    L_SFT-φ = Σ_t φ(p_t) · (−log p_t) / Σ_t 1,   φ(p) = p (1 − p), p = π_θ(y_t) detached   (eq. 8)
    μ(step) = peak · step / warmup                              during the warm-up,
              valley + (peak − valley) · ½ (1 + cos(π · s / decay))   s steps into the decay, then valley

φ down-weights the tokens the policy already predicts (p → 1) and those far from it (p → 0), so the
expert data steers without flattening the policy's entropy (§4.2). The schedule is Trinity-RFT's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar

from undertow.kernel.lazy import torch

from undertow.schemas import Experience, Record
from undertow.trainer.algorithms import Totals, masked, masked_mean
from undertow.trainer.batch import SequenceBatch, collate_experiences

from .api import Objective, StepLoss, policy_logprobs, trained_tokens

if TYPE_CHECKING:
    from undertow.trainer.config import MixingConfig

EXPERT = "expert"  # the metadata key the trainer's intake sets on records read from the expert topic


def is_expert(record: Experience) -> bool:
    return bool(record.metadata.get(EXPERT))


def as_expert(record: Experience) -> Experience:
    """The record marked as a demonstration (the step's records travel to every rank together)."""
    return record.model_copy(update={"metadata": {**record.metadata, EXPERT: True}})


def mu_at(step: int, cfg: "MixingConfig") -> float:
    """μ at optimizer step `step` (from 0): the linear warm-up, the cosine decay, then the valley."""
    if step < cfg.mu_warmup_steps:
        return cfg.mu_peak * step / cfg.mu_warmup_steps
    s = step - cfg.mu_warmup_steps
    if s >= cfg.mu_decay_steps:
        return cfg.mu_valley if cfg.mu_decay_steps else cfg.mu_peak
    return cfg.mu_valley + (cfg.mu_peak - cfg.mu_valley) * 0.5 * (1 + math.cos(math.pi * s / cfg.mu_decay_steps))


def phi_token_loss(logp: torch.Tensor, mask: torch.Tensor, phi: bool) -> torch.Tensor:
    """−log p per trained token, weighed by φ(p) = p(1 − p) (detached) when `phi`; [B, T] -> [B, T]."""
    nll = -logp
    if phi:
        p = logp.detach().exp()
        nll = nll * p * (1 - p)
    return masked(nll, mask)


@dataclass
class MixedBatch:
    """A micro-batch's RL experiences and demonstrations, each collated alone (either may be absent)."""

    usual: SequenceBatch | None
    expert: SequenceBatch | None
    proximal_logp: torch.Tensor | None = None  # the usual part's, when the step computes it up front


@dataclass(frozen=True)
class MixedTotals:
    """The step's normalisers, one per part."""

    usual: Totals
    expert: Totals

    @property
    def tokens(self) -> float:
        return self.usual.tokens + self.expert.tokens

    @property
    def sequences(self) -> int:
        return self.usual.sequences + self.expert.sequences


class ChordObjective:
    """The inner objective (RL) on the step's usual records, SFT-φ on its demonstrations, mixed by μ.
    `begin_step(step)` sets the step μ is taken at; every rank calls it before the step."""

    checks_staleness: ClassVar[bool] = True  # the usual records' bound; demonstrations are never stale

    def __init__(self, inner: Objective, cfg: "MixingConfig", temperature: float = 1.0):
        self.inner, self.cfg, self.temperature = inner, cfg, temperature
        self.record_type: type[Record] = inner.record_type
        self.importance_sampled = inner.importance_sampled
        self.mu = mu_at(0, cfg)

    @property
    def needs_reference(self) -> bool:
        return self.inner.needs_reference

    def begin_step(self, step: int) -> None:
        self.mu = mu_at(step, self.cfg)

    def _split(self, records: list[Experience]) -> tuple[list[Experience], list[Experience]]:
        return [r for r in records if not is_expert(r)], [r for r in records if is_expert(r)]

    def collate(self, records: list[Experience], *, pad_id: int, pad_to_multiple: int) -> MixedBatch:
        usual, expert = self._split(records)
        return MixedBatch(
            self.inner.collate(usual, pad_id=pad_id, pad_to_multiple=pad_to_multiple) if usual else None,
            collate_experiences(expert, pad_id=pad_id, pad_to_multiple=pad_to_multiple) if expert else None)

    def lengths(self, record: Experience) -> list[int]:
        return self.inner.lengths(record)

    def totals(self, records: list[Experience]) -> MixedTotals:
        usual, expert = self._split(records)
        return MixedTotals(self.inner.totals(usual), Totals(float(sum(trained_tokens(e) for e in expert)), len(expert)))

    def logprobs(self, model: Any, batch: MixedBatch) -> torch.Tensor | None:
        return self.inner.logprobs(model, batch.usual) if batch.usual is not None else None

    def loss(self, model: Any, batch: MixedBatch, ref_model: Any = None, totals: MixedTotals | None = None) -> StepLoss:
        mu, loss = self.mu, None
        metrics, parts = {"mu": mu}, {}
        if batch.usual is not None:
            usual = batch.usual if batch.proximal_logp is None else replace(batch.usual, proximal_logp=batch.proximal_logp)
            out = self.inner.loss(model, usual, ref_model, totals.usual if totals else None)
            loss = (1 - mu) * out.loss
            metrics.update(out.metrics)
            parts.update(out.parts)
        if batch.expert is not None:
            logp, _ = policy_logprobs(model, batch.expert, self.temperature)  # [E, T-1]
            tokens = totals.expert.tokens if totals else float(batch.expert.mask.sum())
            sft = phi_token_loss(logp, batch.expert.mask, self.cfg.phi).sum() / max(tokens, 1.0)
            loss = mu * sft if loss is None else loss + mu * sft
            metrics["expert_nll"] = masked_mean(-logp.detach(), batch.expert.mask).item()
            parts["sft_loss"] = sft.item()
        parts["loss"] = loss.item()
        return StepLoss(loss, metrics, parts)

