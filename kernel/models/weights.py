"""A model's weights as safetensors bytes and back: the payload of a WeightUpdate."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def weights_to_bytes(model: "PreTrainedModel") -> bytes:
    """The model's parameters and buffers as safetensors bytes (the payload of a WeightUpdate).

    Tied tensors (GPT-2's lm_head shares the embedding) are stored once; `load_weights` re-ties.
    """
    from safetensors.torch import save

    seen: set[int] = set()
    tensors = {}
    for name, t in model.state_dict().items():
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        tensors[name] = t.detach().contiguous().cpu()
    return save(tensors)


def load_weights(model: "PreTrainedModel", blob: bytes) -> None:
    """Load safetensors bytes from `weights_to_bytes` into `model` in place; every tensor must match."""
    import torch
    from safetensors.torch import load

    tensors = load(blob)
    own = model.state_dict()
    unknown = sorted(set(tensors) - set(own))
    if unknown:
        raise ValueError(f"weights: tensors {unknown[:5]} are not in the model")
    with torch.no_grad():
        for name, t in tensors.items():
            if own[name].shape != t.shape:
                raise ValueError(f"weights: {name} has shape {tuple(t.shape)}, the model {tuple(own[name].shape)}")
            own[name].copy_(t)
    missing = sorted(n for n, t in own.items() if n not in tensors
                     and not any(t.data_ptr() == own[k].data_ptr() for k in tensors))
    if missing:
        raise ValueError(f"weights: tensors {missing[:5]} are missing from the update")
