"""Adapter-only weight updates (trainer.lora) as vLLM LoRA adapters over the base the engine holds.

An adapter blob (kernel/models/adapters.py) is peft's adapter state dict with its LoRA settings in
the metadata: written out as a peft adapter directory, vLLM loads it. Each version gets a new
adapter id (vLLM caches adapters by id) and the previous one is dropped.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from undertow.kernel.models.adapters import adapter_shape


class LoraSlot:
    """The one adapter generations run with (None: the base weights alone)."""

    def __init__(self, base_path: str, max_rank: int):
        self.base_path, self.max_rank = base_path, max_rank
        self.request: Any = None
        self._folder: tempfile.TemporaryDirectory | None = None
        self._ids = 0

    def load(self, llm: Any, blob: bytes) -> None:
        request, folder = self.prepare(blob)
        if not llm.llm_engine.add_lora(request):  # load now: a bad adapter fails here, not mid-generation
            folder.cleanup()
            raise ValueError("adapter: vLLM did not load it")
        self.clear(llm)
        self.request, self._folder = request, folder

    def prepare(self, blob: bytes) -> tuple[Any, tempfile.TemporaryDirectory]:
        """The adapter written out as a peft directory, and the request that names it (not yet loaded)."""
        from vllm.lora.request import LoRARequest

        shape = adapter_shape(blob)
        if shape.rank > self.max_rank:
            raise ValueError(f"adapter: rank {shape.rank} > rollout.engine.max_lora_rank {self.max_rank}")
        folder = tempfile.TemporaryDirectory(prefix="undertow-lora-")
        (Path(folder.name) / "adapter_model.safetensors").write_bytes(blob)
        (Path(folder.name) / "adapter_config.json").write_text(json.dumps({
            "peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": self.base_path,
            "r": shape.rank, "lora_alpha": shape.alpha, "lora_dropout": shape.dropout,
            "target_modules": list(shape.targets or []), "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "use_dora": False, "modules_to_save": None}))
        self._ids += 1
        return LoRARequest(f"undertow-{self._ids}", self._ids, folder.name), folder

    def replace(self, request: Any, folder: tempfile.TemporaryDirectory | None) -> int | None:
        """Make `request` (loaded into the engine by the caller, or None) the current adapter; returns
        the id of the one it replaces, for the caller to remove from the engine."""
        old = self.request.lora_int_id if self.request is not None else None
        if self._folder is not None:
            self._folder.cleanup()
        self.request, self._folder = request, folder
        return old

    def clear(self, llm: Any) -> None:
        """Back to the base weights (a whole-weights update replaces base and adapter alike)."""
        if self.request is not None:
            llm.llm_engine.remove_lora(self.request.lora_int_id)
        if self._folder is not None:
            self._folder.cleanup()
        self.request, self._folder = None, None
