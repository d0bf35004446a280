"""A tiny Llama saved as an HF directory (config, char tokenizer, safetensors): what vLLM can load here."""

from __future__ import annotations

from pathlib import Path


def save_tiny_llama(folder: Path, seed: int = 0, tied: bool = False, init_std: float | None = 0.2) -> Path:
    """Write a 2-layer Llama over kernel's character tokenizer into `folder`; returns it. `init_std`
    None keeps transformers' initialisation (a model to train rather than to check log-probs on)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from undertow.kernel.models.tiny import char_tokenizer

    tok = char_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=tied)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    # Larger than the default 0.02 init: the distributions are far from uniform, the checks sharper.
    with torch.no_grad():
        for p in model.parameters() if init_std is not None else []:
            if p.dim() == 2:
                p.normal_(0, init_std, generator=torch.Generator().manual_seed(seed))
    model.save_pretrained(folder, safe_serialization=True)
    tok.save_pretrained(folder)
    return folder
