"""The tiny model: a small GPT-2 from a config and a character tokenizer made in memory (no download)."""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

    from undertow.kernel.models.spec import ModelSpec

# The tiny model's alphabet: enough for arithmetic, Countdown and short English prompts.
CHARSET = string.digits + string.ascii_letters + " +-*/=()<>.,:;?!'\"#_\n"
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def char_tokenizer() -> "PreTrainedTokenizerFast":
    """One token per character of CHARSET; built in memory, no download."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + list(CHARSET))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # Any one character, newlines too ("." left "\n\n" whole, an unknown token).
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>", model_input_names=["input_ids", "attention_mask"])
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def tiny_gpt2(spec: "ModelSpec") -> "PreTrainedModel":
    """The tiny GPT-2 of `spec.tiny`, initialised from `spec.seed` (same spec, same weights)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tok = char_tokenizer()
    config = GPT2Config(vocab_size=len(tok), n_positions=spec.tiny.n_positions, n_embd=spec.tiny.n_embd,
                        n_layer=spec.tiny.n_layer, n_head=spec.tiny.n_head, bos_token_id=tok.bos_token_id,
                        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        return GPT2LMHeadModel(config)
