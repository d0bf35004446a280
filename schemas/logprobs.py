"""How a token's log-prob is computed: one definition for the rollout engines and the trainer.

With the same weights, the behaviour log-probs an engine records and the log-probs the trainer
recomputes must agree (≤ 1e-4 in fp32), or every importance ratio is off. Both call these.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def position_ids(attention_mask: "torch.Tensor") -> "torch.Tensor":
    """Positions counted over real tokens only, so left and right padding give the same logits."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def token_logprobs(logits: "torch.Tensor", targets: "torch.Tensor", temperature: float = 1.0) -> "torch.Tensor":
    """log p(target) under softmax(logits / temperature), in fp32 at least.  logits [..., V], targets [...]."""
    import torch

    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # bf16 up to fp32; fp64 stays
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def sequence_logprobs(model: "torch.nn.Module", input_ids: "torch.Tensor", attention_mask: "torch.Tensor",
                      temperature: float = 1.0, first: int = 0) -> "torch.Tensor":
    """Log-prob of each token given the ones before it.  input_ids [B, T] -> [B, T-1] (for tokens 1..T-1).

    Columns before `first` are 0 and their logits never computed (the model's `logits_to_keep`): a
    prompt's positions predict nothing a loss reads, and the vocabulary projection and its softmax
    over every position are a large share of a small model's step."""
    import torch

    kept = {"logits_to_keep": input_ids.shape[1] - first} if first > 0 else {}
    logits = model(input_ids=input_ids, attention_mask=attention_mask,
                   position_ids=position_ids(attention_mask), **kept).logits  # [B, T - first, V]
    logp = token_logprobs(logits[:, :-1], input_ids[:, first + 1:], temperature)  # [B, T-1-first]
    return torch.nn.functional.pad(logp, (first, 0)) if first > 0 else logp
