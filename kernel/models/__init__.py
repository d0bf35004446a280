"""The policy model: its spec, its sources (a registry: tiny, hf, gguf, …), and the builders every
stage uses, so rollout engines and the trainer always hold the same model."""

from undertow.kernel.models.builders import build_model, build_tokenizer, local_dir, tokenizer_dir
from undertow.kernel.models.gguf import SMOLLM2_GGUF, find_smollm2_gguf
from undertow.kernel.models.sources import model_sources
from undertow.kernel.models.spec import ModelSpec, TinyModel
from undertow.kernel.models.tiny import CHARSET, char_tokenizer
from undertow.kernel.models.tokenizer import TokenizerMismatch, fingerprint
from undertow.kernel.models.weights import load_weights, weights_to_bytes

__all__ = ["CHARSET", "SMOLLM2_GGUF", "ModelSpec", "TinyModel", "TokenizerMismatch", "build_model", "build_tokenizer",
           "char_tokenizer", "find_smollm2_gguf", "fingerprint", "load_weights", "local_dir", "model_sources",
           "tokenizer_dir", "weights_to_bytes"]
