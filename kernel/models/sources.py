"""Where a policy model comes from: one registered source per kind (`model.source` in config).

A source says whether a spec suits it, where its HF directory is (engines such as vLLM load from
there), and builds its tokenizer and model. A LoRA-wrapped or engine-specific loader is one more
class registered here (or named by dotted path), not another branch in the builders.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from undertow.kernel.models.gguf import dequantized_dir, find_smollm2_gguf
from undertow.kernel.models.tokenizer import load_tokenizer
from undertow.kernel.models.tiny import char_tokenizer, tiny_gpt2
from undertow.kernel.registry import Registry

if TYPE_CHECKING:
    from undertow.kernel.models.spec import ModelSpec

model_sources: Registry[Any] = Registry("model source")


@model_sources.register("tiny")
class TinySource:
    """The tiny GPT-2 of `model.tiny` with the character tokenizer: built in memory, no files."""

    @staticmethod
    def check(spec: "ModelSpec") -> None:
        pass

    @staticmethod
    def local_dir(spec: "ModelSpec") -> str:
        raise ValueError("model.source 'tiny' has no directory: it is built in memory (use hf or gguf)")

    @staticmethod
    def tokenizer(spec: "ModelSpec") -> Any:
        return char_tokenizer()

    @staticmethod
    def model(spec: "ModelSpec") -> Any:
        return tiny_gpt2(spec)


@model_sources.register("hf")
class HFDirectorySource:
    """A Hugging Face model directory (`model.path`): config, tokenizer and safetensors."""

    @staticmethod
    def check(spec: "ModelSpec") -> None:
        if not spec.path:
            raise ValueError("path: an HF model directory is required when source is 'hf'")

    @staticmethod
    def local_dir(spec: "ModelSpec") -> str:
        return str(spec.path)

    @classmethod
    def tokenizer(cls, spec: "ModelSpec") -> Any:
        return load_tokenizer(cls.local_dir(spec))

    @classmethod
    def model(cls, spec: "ModelSpec") -> Any:
        import torch
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(cls.local_dir(spec), torch_dtype=getattr(torch, spec.dtype))


@model_sources.register("gguf")
class GGUFSource(HFDirectorySource):
    """A GGUF file (`model.path`, default SmolLM2-135M-Instruct from PyPI), dequantized once into an HF directory."""

    @staticmethod
    def check(spec: "ModelSpec") -> None:
        pass

    @staticmethod
    def local_dir(spec: "ModelSpec") -> str:
        return dequantized_dir(Path(spec.path) if spec.path else find_smollm2_gguf())
