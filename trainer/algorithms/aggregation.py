"""How per-token losses [B, T] become one number. The choice changes what long answers weigh.

token_mean            Σ_i,t L / Σ_i,t m            every token weighs the same (DAPO, eq. 12)
seq_mean_token_sum    1/B Σ_i Σ_t L                every sequence's summed loss (REINFORCE as written)
seq_mean_token_mean   1/B Σ_i (Σ_t L / Σ_t m)      GRPO's original (Shao et al. 2024, eq. 3)
dr_grpo               Σ_i,t L / (B · max_tokens)   constant normaliser, no length bias
                                                   (Liu et al. 2025, "Understanding R1-Zero-Like Training")
"""

from __future__ import annotations

import torch

from .base import aggregations


@aggregations.register("token_mean")
def token_mean(token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (token_loss * mask).sum() / mask.sum().clamp(min=1)


@aggregations.register("seq_mean_token_sum")
def seq_mean_token_sum(token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (token_loss * mask).sum(-1).mean()


@aggregations.register("seq_mean_token_mean")
def seq_mean_token_mean(token_loss: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    per_sequence = (token_loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)  # [B]
    return per_sequence.mean()


@aggregations.register("dr_grpo")
def dr_grpo(token_loss: torch.Tensor, mask: torch.Tensor, *, max_tokens: int = 256) -> torch.Tensor:
    if max_tokens < 1:
        raise ValueError(f"max_tokens: expected >= 1, got {max_tokens}")
    return (token_loss * mask).sum() / (token_loss.shape[0] * max_tokens)
