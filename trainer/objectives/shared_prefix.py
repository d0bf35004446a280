"""The prompt a group's samples share, run once: a GRPO group is 8 answers to one prompt, and the
prompt is most of each row (SmolLM2's chat prompt for a sum is ~45 tokens, its answer ~11).

    head = model(x[0, :P])                          the shared prefix, one row, its KV cache kept
    tail = model(x[:, P:], cache = head's × B)      every row's rest, attending to that cache
    logits = [head's last column] ++ tail's         the columns the loss reads, as one full pass gives

The cache keeps its graph, so the backward pass reaches the prefix's activations through it, and
the gradient is the full rows' (the same sums in another order: float32 rounding, ~1e-6 relative).
The common prefix is found from the tokens, so it needs no grouping: rows of different prompts
still share the chat template's system turn. Where it cannot pay or cannot apply (one row, a prefix
under MIN_PREFIX tokens, logits asked inside the prefix, gradient checkpointing, which turns the
cache off) the model runs on the full rows."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from undertow.kernel.lazy import torch

MIN_PREFIX = 8  # below this the second call costs more than the columns it saves


def common_prefix(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> int:
    """Leading columns in which every row holds the same real (unmasked) token."""
    same = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0)
    differs = (~same).nonzero()
    return int(differs[0]) if len(differs) else input_ids.shape[1]


def checkpointing(model: Any) -> bool:
    inner = getattr(model, "module", model)  # a DeepSpeed engine's model
    return bool(getattr(inner, "is_gradient_checkpointing", False))


class SharedPrefix:
    """Calls `model` as a full forward pass would, running the rows' common prefix once."""

    def __init__(self, model: Any):
        self.model = model

    def __call__(self, *, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
                 logits_to_keep: int = 0) -> Any:
        rows, width = input_ids.shape
        keep = logits_to_keep or width
        # The head yields the logits of its last column only: the prefix ends at most one column
        # into the ones asked for.
        prefix = min(common_prefix(input_ids, attention_mask), width - keep + 1, width - 1)
        if rows < 2 or prefix < MIN_PREFIX or checkpointing(self.model):
            return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                              logits_to_keep=logits_to_keep)
        head = self.model(input_ids=input_ids[:1, :prefix], attention_mask=attention_mask[:1, :prefix],
                          position_ids=position_ids[:1, :prefix], use_cache=True, logits_to_keep=1)
        cache = head.past_key_values
        cache.batch_repeat_interleave(rows)
        tail = self.model(input_ids=input_ids[:, prefix:], attention_mask=attention_mask,
                          position_ids=position_ids[:, prefix:], past_key_values=cache, use_cache=False,
                          logits_to_keep=min(keep, width - prefix))
        logits = tail.logits
        if keep > width - prefix:
            logits = torch.cat([head.logits.expand(rows, -1, -1), logits], dim=1)
        return SimpleNamespace(logits=logits)
