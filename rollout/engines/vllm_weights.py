"""What a whole-weights update must look like for an engine that loads its own checkpoint (vLLM).

The transformers engine checks an update against its model's state dict (kernel/models/weights.py);
vLLM's model has fused, repacked parameters instead, so the reference is the HF checkpoint it was
started from: the same names and shapes the trainer's `weights_to_bytes` writes.
"""

from __future__ import annotations

import json
from pathlib import Path


def checkpoint_shapes(folder: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of every *.safetensors file in an HF directory (headers only)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        shapes.update(header_shapes(file.read_bytes()[:_header_end(file)]))
    if not shapes:
        raise ValueError(f"{folder}: no safetensors weights (vLLM needs an HF directory with them)")
    return shapes


def header_shapes(blob: bytes) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from the JSON header of safetensors bytes."""
    size = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + size])
    return {name: tuple(entry["shape"]) for name, entry in header.items() if name != "__metadata__"}


def check_update(blob: bytes, expected: dict[str, tuple[int, ...]]) -> None:
    """Raise ValueError unless `blob` holds exactly the checkpoint's tensors, each of its shape."""
    try:
        shapes = header_shapes(blob)
    except (ValueError, KeyError) as e:
        raise ValueError(f"weights: not a safetensors blob ({e})") from None
    unknown = sorted(set(shapes) - set(expected))
    if unknown:
        raise ValueError(f"weights: tensors {unknown[:5]} are not in the model")
    for name, shape in shapes.items():
        if shape != expected[name]:
            raise ValueError(f"weights: {name} has shape {shape}, the model {expected[name]}")
    missing = sorted(set(expected) - set(shapes))
    if missing:
        raise ValueError(f"weights: tensors {missing[:5]} are missing from the update")


def _header_end(file: Path) -> int:
    with file.open("rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")
