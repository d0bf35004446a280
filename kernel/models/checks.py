"""What can be checked about a model before anything is built: that its files are there, and how long
a sequence it takes. Read from the files' headers (config.json, GGUF metadata), never by loading weights,
so that `undertow config check` and every component's start say so in a second, not after a broker,
the children and a model build.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from undertow.kernel.models.spec import ModelSpec

# config.json keys that hold a model's longest sequence, in the order transformers' families use them
CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length", "max_seq_len", "max_sequence_length")


def missing_weights(path: str) -> str | None:
    """Why `path` (an `init_from`: an HF export directory or a .safetensors file) cannot be loaded, or None."""
    target = Path(path).expanduser()
    if target.is_dir():
        return None if (target / "model.safetensors").is_file() else f"{path} has no model.safetensors"
    if target.is_file():
        return None if target.suffix == ".safetensors" else f"{path} is not a .safetensors file"
    return f"{path} does not exist"


def model_problems(spec: "ModelSpec", section: str = "model") -> Iterator[str]:
    """Each missing file of `spec`, naming its field: `model.path`, `model.init_from`."""
    if spec.source == "hf" and spec.path:
        directory = Path(spec.path).expanduser()
        if not directory.is_dir():
            yield f"{section}.path ({spec.path}) does not exist: source 'hf' needs an HF model directory"
        elif not (directory / "config.json").is_file():
            yield f"{section}.path ({spec.path}) has no config.json: not an HF model directory"
    if spec.source == "gguf" and spec.path and not Path(spec.path).expanduser().is_file():
        yield f"{section}.path ({spec.path}) does not exist: source 'gguf' needs a GGUF file"
    if spec.init_from and (problem := missing_weights(spec.init_from)):
        yield f"{section}.init_from: {problem}"


def context_length(spec: "ModelSpec") -> tuple[int, str] | None:
    """(the model's longest sequence in tokens, where that was read), or None when it says none."""
    if spec.source == "tiny":
        return spec.tiny.n_positions, "model.tiny.n_positions"
    if spec.source == "hf" and spec.path:
        config = Path(spec.path).expanduser() / "config.json"
        try:
            values = json.loads(config.read_text())
        except (OSError, ValueError):
            return None
        values = {**values, **(values.get("text_config") or {})}  # multimodal configs nest the LM's
        for key in CONTEXT_KEYS:
            if isinstance(values.get(key), int) and values[key] > 0:
                return values[key], f"{spec.path}/config.json {key}"
        return None
    if spec.source == "gguf":
        return _gguf_context(spec.path)
    return None  # a source of a user's: nothing to read without building it


def _gguf_context(path: str | None) -> tuple[int, str] | None:
    try:
        from gguf import GGUFReader

        from undertow.kernel.models.gguf import find_smollm2_gguf

        file = Path(path).expanduser() if path else find_smollm2_gguf()
        fields = GGUFReader(str(file)).fields
    except Exception:  # no gguf package, no file (reported above), a file it cannot read
        return None
    for name, field in fields.items():
        if name.endswith(".context_length"):
            return int(field.contents()), f"{file.name} {name}"
    return None
