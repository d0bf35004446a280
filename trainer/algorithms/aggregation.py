"""How per-token losses [B, T] become one number. The choice changes what long answers weigh.

token_mean            Σ_i,t L / Σ_i,t m            every token weighs the same (DAPO, eq. 12)
token_sum             Σ_i,t L                      the same, unnormalised: the step's size grows with its
                                                   tokens (verl's token-sum; lr scaled to match)
seq_mean_token_sum    1/B Σ_i Σ_t L                every sequence's summed loss (REINFORCE as written)
seq_mean_token_mean   1/B Σ_i (Σ_t L / Σ_t m)      GRPO's original (Shao et al. 2024, eq. 3)
seq_mean_token_sum_norm Σ_i,t L / (B · max_tokens) constant normaliser, no length bias: Dr. GRPO's
                                                   (Liu et al. 2025, "Understanding R1-Zero-Like Training")

Σ m and B are the whole optimizer step's (`totals`), not the micro-batch's: the sum over the
micro-batches (and ranks) of a step is then exactly the loss of the step in one pass. Without
`totals` they are this batch's own.
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import Totals, aggregations, masked


@aggregations.register("token_mean")
def token_mean(token_loss: torch.Tensor, mask: torch.Tensor, totals: Totals | None = None) -> torch.Tensor:
    totals = totals or Totals.of(mask)
    return masked(token_loss, mask).sum() / max(totals.tokens, 1.0)


@aggregations.register("token_sum")
def token_sum(token_loss: torch.Tensor, mask: torch.Tensor, totals: Totals | None = None) -> torch.Tensor:
    return masked(token_loss, mask).sum()  # a sum needs no totals: the micro-batches' sums add up


@aggregations.register("seq_mean_token_sum")
def seq_mean_token_sum(token_loss: torch.Tensor, mask: torch.Tensor, totals: Totals | None = None) -> torch.Tensor:
    totals = totals or Totals.of(mask)
    return masked(token_loss, mask).sum() / max(totals.sequences, 1)


@aggregations.register("seq_mean_token_mean")
def seq_mean_token_mean(token_loss: torch.Tensor, mask: torch.Tensor, totals: Totals | None = None) -> torch.Tensor:
    totals = totals or Totals.of(mask)
    per_sequence = masked(token_loss, mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
    return per_sequence.sum() / max(totals.sequences, 1)


@aggregations.register("seq_mean_token_sum_norm")  # verl's name; Dr. GRPO's advantage is processors' dr_grpo
def seq_mean_token_sum_norm(token_loss: torch.Tensor, mask: torch.Tensor, totals: Totals | None = None, *,
            max_tokens: int = 256) -> torch.Tensor:
    if max_tokens < 1:
        raise ValueError(f"max_tokens: expected >= 1, got {max_tokens}")
    totals = totals or Totals.of(mask)
    return masked(token_loss, mask).sum() / (max(totals.sequences, 1) * max_tokens)
