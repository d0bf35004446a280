"""LoRA adapters (peft) on the policy: the trainer wraps its model, publishes only the adapter, and a
rollout engine applies it over the base weights it already holds.

An adapter blob is safetensors bytes of peft's adapter state dict, with the LoRA settings in the
file's metadata: it describes itself, so an engine needs nothing but the blob to apply it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel

ADAPTER_KEY = "undertow.lora"


@dataclass(frozen=True)
class LoraShape:
    """What a LoRA adapter is: rank, scale α (the update is α/r · B A), dropout, target modules."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    targets: tuple[str, ...] | None = None  # None: peft's defaults for the architecture


def wrap_lora(model: "PreTrainedModel", shape: LoraShape) -> Any:
    """`model` with fresh LoRA adapters (B = 0: the wrapped model computes what the base does);
    only the adapters require grad."""
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(r=shape.rank, lora_alpha=shape.alpha, lora_dropout=shape.dropout,
                        target_modules=list(shape.targets) if shape.targets else None, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def shape_of(peft_model: Any) -> LoraShape:
    config = peft_model.peft_config["default"]
    return LoraShape(config.r, float(config.lora_alpha), float(config.lora_dropout),
                     tuple(sorted(config.target_modules)))


def adapter_tensors(peft_model: Any) -> tuple[dict[str, Any], dict[str, str]]:
    """The adapter's tensors (not the base), and the metadata that makes their file self-describing."""
    from peft import get_peft_model_state_dict

    tensors = {k: v.detach().contiguous().cpu() for k, v in get_peft_model_state_dict(peft_model).items()}
    shape = asdict(shape_of(peft_model))
    return tensors, {ADAPTER_KEY: json.dumps({**shape, "targets": list(shape["targets"])})}


def adapter_to_bytes(peft_model: Any) -> bytes:
    """The adapter's tensors as self-describing safetensors bytes."""
    from safetensors.torch import save

    tensors, metadata = adapter_tensors(peft_model)
    return save(tensors, metadata=metadata)


def is_adapter(blob: bytes) -> bool:
    """Whether safetensors `blob` is an adapter (else: whole weights)."""
    return adapter_shape(blob) is not None


def adapter_shape(blob: bytes) -> LoraShape | None:
    """The LoRA settings an adapter blob carries; None for whole weights."""
    # The safetensors format: 8 bytes of header length, then the JSON header with "__metadata__".
    size = int.from_bytes(blob[:8], "little")
    meta = json.loads(blob[8:8 + size]).get("__metadata__") or {}
    if ADAPTER_KEY not in meta:
        return None
    fields = json.loads(meta[ADAPTER_KEY])
    return LoraShape(fields["rank"], fields["alpha"], fields["dropout"], tuple(fields["targets"]))


def apply_adapter(model: Any, blob: bytes) -> Any:
    """`model` (a base model, or one already wrapped by an earlier call) with the adapter in `blob`
    loaded; returns the wrapped model. Every adapter tensor must match; the base is untouched."""
    from peft import PeftModel, set_peft_model_state_dict
    from safetensors.torch import load

    shape = adapter_shape(blob)
    if shape is None:
        raise ValueError("adapter: the blob holds whole weights, not a LoRA adapter")
    if not isinstance(model, PeftModel):
        model = wrap_lora(model, shape)
    elif shape_of(model) != shape:
        raise ValueError(f"adapter: shape {shape} differs from the one applied before, {shape_of(model)}")
    tensors = load(blob)
    result = set_peft_model_state_dict(model, tensors)
    unexpected = getattr(result, "unexpected_keys", [])
    if unexpected:
        raise ValueError(f"adapter: tensors {sorted(unexpected)[:5]} are not in the model")
    return model
