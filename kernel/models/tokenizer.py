"""One tokenizer in every environment, and the proof of it.

A model directory's tokenizer.json is the whole pipeline. Its tokenizer_config.json may name the
model's own class (`LlamaTokenizer`), and transformers 5 then rebuilds that class's pipeline instead
of the file's: SmolLM2's byte-level BPE lost every space and newline in the vLLM environment while
the trainer's transformers 4 read the file. So both load a copy of the directory whose config names
the plain fast class (`portable_dir`), and every tokenizer is checked where it is built: it must give
back the text it encoded, and its `fingerprint` (the ids of a few probe texts) travels with the
trainer's weights so that a rollout worker that tokenizes otherwise refuses to go on.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

PORTABLE_CLASS = "PreTrainedTokenizerFast"
# Keys only a model's own tokenizer class reads; tokenizer.json already holds what they did.
CLASS_KEYS = ("add_bos_token", "add_eos_token", "add_prefix_space", "legacy", "sp_model_kwargs",
              "use_default_system_prompt", "auto_map")
# config.json too: vLLM reads the model type beside a tokenizer, and logs errors when it is missing.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "config.json")
# Inside the tiny model's alphabet, so that every shipped model can give it back exactly.
ROUND_TRIP = "What is 14 - 9?\nAnswer: 5, then 12 + 7 = 19."
PROBES = (ROUND_TRIP, " 5\nHello world", "Two  spaces,\ttab; 3.14 * (2 - 7) = -15.7!\n\n",
          "Café naïve Ünïcödé: 東京 🙂 “quoted”")


class TokenizerMismatch(RuntimeError):
    """A tokenizer that does not give back its text, or that differs from the trainer's."""


def portable_dir(directory: str) -> str:
    """`directory` itself when its tokenizer config already names the plain fast class (or it has no
    tokenizer.json), else a cached copy of its tokenizer files whose config does."""
    source = Path(directory)
    config_file = source / "tokenizer_config.json"
    config = json.loads(config_file.read_text()) if config_file.exists() else {}
    if not (source / "tokenizer.json").exists() or is_portable(config):
        return directory
    files = [source / name for name in TOKENIZER_FILES if (source / name).exists()]
    digest = hashlib.sha256(b"".join(f.name.encode() + f.read_bytes() for f in files)).hexdigest()[:16]
    cache = Path(os.environ.get("UNDERTOW_CACHE", Path.home() / ".cache" / "undertow")) / "tokenizers" / digest
    if not (cache / "tokenizer_config.json").exists():
        tmp = cache.with_name(f"{digest}.tmp-{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        for f in files:
            shutil.copyfile(f, tmp / f.name)
        (tmp / "tokenizer_config.json").write_text(json.dumps(portable_config(config), indent=1))
        try:
            tmp.rename(cache)
        except OSError:  # another process made the same copy first
            shutil.rmtree(tmp, ignore_errors=True)
    return str(cache)


def is_portable(config: dict[str, Any]) -> bool:
    return (config.get("tokenizer_class") == PORTABLE_CLASS and config.get("clean_up_tokenization_spaces") is False
            and not any(key in config for key in CLASS_KEYS))


def portable_config(config: dict[str, Any]) -> dict[str, Any]:
    """`config` naming the plain fast class; decoding gives back the text (no space clean-up)."""
    kept = {k: v for k, v in config.items() if k not in CLASS_KEYS}
    return {**kept, "tokenizer_class": PORTABLE_CLASS, "clean_up_tokenization_spaces": False}


def load_tokenizer(directory: str) -> Any:
    """The tokenizer of an HF directory, read from its tokenizer.json alike by every transformers
    version, with a pad token and without token_type_ids."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(portable_dir(directory), model_input_names=["input_ids", "attention_mask"])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def check_round_trip(tok: Any, name: str) -> None:
    """Raise TokenizerMismatch unless `tok` decodes its own encoding of ROUND_TRIP back to it."""
    ids = tok(ROUND_TRIP, add_special_tokens=False)["input_ids"]
    back = tok.decode(ids)
    if back != ROUND_TRIP:
        raise TokenizerMismatch(f"the tokenizer of model {name!r} ({type(tok).__name__}) does not give back its "
                                f"text: {ROUND_TRIP!r} -> {len(ids)} ids -> {back!r}")


def encodings(tok: Any) -> dict[str, Any]:
    """What a tokenizer does to the probes: the ids with and without special tokens, the chat
    template's prompt, BOS and EOS and the vocabulary size (not the pad token: undertow sets one where
    the model has none, and padding is masked)."""
    template = None
    if getattr(tok, "chat_template", None):
        text = tok.apply_chat_template([{"role": "user", "content": ROUND_TRIP}], add_generation_prompt=True,
                                       tokenize=False)
        template = tok(text, add_special_tokens=False)["input_ids"]
    return {"plain": [tok(p, add_special_tokens=False)["input_ids"] for p in PROBES],
            "special": tok(ROUND_TRIP)["input_ids"], "chat": template,
            "ids": [tok.bos_token_id, tok.eos_token_id], "size": len(tok)}


def fingerprint(tok: Any) -> str:
    """A short digest of `encodings(tok)`: equal fingerprints, equal tokenization of the probes."""
    return hashlib.sha256(json.dumps(encodings(tok), sort_keys=True).encode()).hexdigest()[:16]
