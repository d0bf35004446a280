"""Supervised fine-tuning: negative log-likelihood of the response tokens the mask keeps.

    L_t = −log π_θ(y_t) · m_t     (then aggregated, token_mean by default)
"""

from __future__ import annotations

from undertow.kernel.lazy import torch


def sft_token_loss(logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return -logp * mask  # [B, T]
