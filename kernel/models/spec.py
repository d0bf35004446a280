"""Which policy model a run trains and serves: one ModelSpec, built the same way by every stage."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from undertow.kernel.registry import checked_entry


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
    source: str = Field("tiny", description="a model source (kernel/models/sources.py): tiny (a config), hf (an "
                                            "HF directory), gguf (a GGUF file), or a dotted path")
    path: str | None = Field(None, description="HF model directory, or GGUF file (default: SmolLM2 from PyPI)")
    tiny: TinyModel = Field(default_factory=TinyModel, description="architecture when source is 'tiny'")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="parameter dtype")
    seed: int = Field(0, description="initialisation seed of the tiny model")
    init_from: str | None = Field(None, description="weights to start from: an HF export directory or a "
                                  ".safetensors file (e.g. the previous stage's checkpoint)")

    @field_validator("source")
    @classmethod
    def _known_source(cls, value: str) -> str:
        from undertow.kernel.models.sources import model_sources  # registers the built-in sources

        return checked_entry(model_sources, value)

    @model_validator(mode="after")
    def _source_accepts(self) -> "ModelSpec":
        from undertow.kernel.models.sources import model_sources

        model_sources.get(self.source).check(self)
        return self
