"""What a whole-weights update must look like for an engine that loads its own checkpoint (vLLM).

The transformers engine checks an update against its model's state dict (kernel/models/weights.py);
vLLM's model has fused, repacked parameters instead, so the reference is the HF checkpoint it was
started from: the same names and shapes the trainer writes.
"""

from __future__ import annotations

from pathlib import Path

from undertow.kernel.models.weights import check_fits, files_shapes, read_header


def checkpoint_shapes(folder: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape of every *.safetensors file in an HF directory (headers only)."""
    shapes = files_shapes(sorted(Path(folder).glob("*.safetensors")))
    if not shapes:
        raise ValueError(f"{folder}: no safetensors weights (vLLM needs an HF directory with them)")
    return shapes


def check_update(blob: bytes, expected: dict[str, tuple[int, ...]]) -> None:
    """Raise ValueError unless `blob` holds exactly the checkpoint's tensors, each of its shape."""
    header, _ = read_header(blob)
    check_fits({name: shape for name, (_, shape) in header.items()}, expected)
