"""The policy model as both sides build it: rollout engines and the trainer call these with one ModelSpec.

A WeightUpdate carries only tensors; both sides must agree on the architecture and tokenizer, and
on how a log-prob is computed (schemas/logprobs.py). torch and transformers are imported lazily so
that importing the kernel stays light for processors.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from undertow.kernel.models.sources import model_sources
from undertow.kernel.models.spec import ModelSpec
from undertow.kernel.models.tokenizer import check_round_trip, portable_dir
from undertow.kernel.models.weights import load_weights

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast


def _source(spec: ModelSpec) -> Any:
    return model_sources.get(spec.source)


def build_tokenizer(spec: ModelSpec) -> "PreTrainedTokenizerFast":
    """The tokenizer of `spec`, with a pad token and without token_type_ids; refused (TokenizerMismatch)
    when it does not give back the text it encodes."""
    tok = _source(spec).tokenizer(spec)
    check_round_trip(tok, spec.name)
    return tok


def build_model(spec: ModelSpec) -> "PreTrainedModel":
    """The causal LM of `spec` in eval mode, in `spec.dtype`; the same spec always gives the same
    initial weights, then `spec.init_from`'s if set."""
    import torch

    model = _source(spec).model(spec).to(getattr(torch, spec.dtype))
    if spec.init_from:
        path = Path(spec.init_from).expanduser()
        load_weights(model, (path / "model.safetensors" if path.is_dir() else path).read_bytes())
    return model.eval()


def local_dir(spec: ModelSpec) -> str:
    """The HF directory `spec` loads from, for engines that load a model themselves (vLLM)."""
    return _source(spec).local_dir(spec)


def tokenizer_dir(spec: ModelSpec) -> str:
    """The directory whose tokenizer `build_tokenizer` loads, for engines that load one themselves."""
    return portable_dir(local_dir(spec))
