"""A GGUF file's tokenizer, rebuilt from the file's own vocabulary and rules into a plain tokenizer.json.

transformers' GGUF conversion (4.57) contradicts SmolLM2's file three ways: its config names
`LlamaTokenizer` (transformers 5 rebuilds that as a SentencePiece pipeline that drops spaces and
newlines); its EOS is `<|im_start|>` where the file says `<|im_end|>` (so generation ran past the end
of an answer); and it adds a BOS the file says not to add. Here the byte-level BPE the file describes
is built with the `tokenizers` library, splitting text as llama.cpp does for the file's
`tokenizer.ggml.pre`, and its config names the plain fast class, read alike by every transformers
version.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from undertow.kernel.models.tokenizer import PORTABLE_CLASS

FORMAT = "1"  # bump when what is written here changes: cached directories are rewritten
MARKER = "undertow-tokenizer"
CONTROL, USER_DEFINED = 3, 4  # GGUF token types
# llama.cpp's pre-tokenizer types (llama-vocab.cpp) whose regexes are GPT-2's, after splitting
# every digit apart for those that do.
SINGLE_DIGITS = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
GPT2_SPLIT = {"default", "gpt2", "mpt", "olmo", "jais"}


def write_gguf_tokenizer(gguf: Path, folder: Path) -> None:
    """Write tokenizer.json and tokenizer_config.json for `gguf` into `folder` (once per FORMAT)."""
    marker = folder / MARKER
    if marker.exists() and marker.read_text() == FORMAT:
        return
    from gguf import GGUFReader

    fields = {name: field.contents() for name, field in GGUFReader(str(gguf)).fields.items()
              if name.startswith("tokenizer.") or name.endswith(".context_length")}
    tokenizer, config = build(fields, gguf.name)
    for stale in ("special_tokens_map.json", "chat_template.jinja", "tokenizer.model"):
        (folder / stale).unlink(missing_ok=True)
    _replace(folder / "tokenizer.json", tokenizer.to_str())
    _replace(folder / "tokenizer_config.json", json.dumps(config, indent=1))
    _replace(marker, FORMAT)


def build(fields: dict[str, Any], name: str) -> tuple[Any, dict[str, Any]]:
    """The `tokenizers.Tokenizer` and the tokenizer config that GGUF metadata `fields` describe."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind, pre = fields.get("tokenizer.ggml.model"), fields.get("tokenizer.ggml.pre", "default")
    if kind != "gpt2" or pre not in SINGLE_DIGITS | GPT2_SPLIT:
        raise ValueError(f"{name}: tokenizer {kind!r} with pre-tokenizer {pre!r} is not one undertow rebuilds "
                         f"(byte-level BPE: {sorted(SINGLE_DIGITS | GPT2_SPLIT)}); convert the model to an HF "
                         f"directory and use model.source: hf")
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                         if pre in SINGLE_DIGITS else byte_level)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, type_ in zip(tokens, types) if type_ == CONTROL])
    tok.add_tokens([AddedToken(t, normalized=False) for t, type_ in zip(tokens, types) if type_ == USER_DEFINED])
    special = {role: tokens[fields[f"tokenizer.ggml.{key}_token_id"]]
               for role, key in (("bos", "bos"), ("eos", "eos"), ("unk", "unknown"), ("pad", "padding"))
               if f"tokenizer.ggml.{key}_token_id" in fields}
    if fields.get("tokenizer.ggml.add_bos_token") and "bos" in special:
        bos = special["bos"]
        tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                           special_tokens=[(bos, tokens.index(bos))])
    context = next((v for k, v in fields.items() if k.endswith(".context_length")), None)
    config = {"tokenizer_class": PORTABLE_CLASS, "clean_up_tokenization_spaces": False,
              **{f"{role}_token": t for role, t in special.items()},
              "model_input_names": ["input_ids", "attention_mask"]}
    if context:
        config["model_max_length"] = int(context)
    if fields.get("tokenizer.chat_template"):
        config["chat_template"] = fields["tokenizer.chat_template"]
    return tok, config


def _replace(path: Path, text: str) -> None:
    """Write atomically: the trainer and the rollout workers may convert the same file at once."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text)
    tmp.replace(path)
