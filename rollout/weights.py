"""A policy version ready to load, and reassembling inline chunks into one (pure; the subscriber feeds it)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from undertow.schemas import WeightUpdate, assemble_weights


@dataclass
class Assembled:
    """A complete, checksum-verified version held as one blob (the kafka transport)."""

    model: str
    version: int
    blob: bytes

    def load_into(self, engine: Any) -> None:
        engine.load_weights(self.blob)

    def discard(self) -> None:
        pass


@dataclass
class Staged:
    """A complete, verified version as bucket files in a local staging directory (files, broadcast);
    the engine streams them in tensor by tensor, and the directory goes once loaded."""

    model: str
    version: int
    payload: str
    files: list[Path]
    directory: Path
    via: str  # the transport that brought it

    def load_into(self, engine: Any) -> None:
        try:
            if self.payload == "adapter":  # one self-describing bucket, applied whole by peft / vLLM LoRA
                engine.load_weights(self.files[0].read_bytes())
            else:
                engine.load_weight_files(self.files)
        finally:
            self.discard()

    def discard(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


@dataclass
class Incomplete:
    """A version given up on: a newer one was complete before all of its chunks came."""

    model: str
    version: int
    received: int
    num_chunks: int


@dataclass
class WeightAssembler:
    """Collects chunks of one model's versions; returns a version once all its chunks are in.

    Raises WeightIntegrityError (from `schemas.assemble_weights`) for a version whose chunks do not
    add up; that version is forgotten, the caller keeps its weights. The newest assembled version
    again is a redelivery and ignored. An older one means the trainer resumed from an earlier
    checkpoint (the topic has one partition, read in order): the assembler follows it back.
    Partial versions older than an assembled one are dropped into `incomplete`, for the caller to report.
    """

    model: str
    newest: int = -1
    pending: dict[int, dict[int, WeightUpdate]] = field(default_factory=dict)
    incomplete: list[Incomplete] = field(default_factory=list)

    def add(self, chunk: WeightUpdate) -> Assembled | None:
        if chunk.model != self.model or chunk.version == self.newest:
            return None
        if chunk.version < self.newest:
            self.newest, self.pending = chunk.version - 1, {}
        chunks = self.pending.setdefault(chunk.version, {})
        chunks.setdefault(chunk.chunk_index, chunk)
        if len(chunks) < chunk.num_chunks:
            return None
        del self.pending[chunk.version]
        blob = assemble_weights(chunks.values())
        self.newest = chunk.version
        # Older partial versions can no longer be wanted.
        for version in [v for v in self.pending if v < chunk.version]:
            parts = self.pending.pop(version)
            self.incomplete.append(Incomplete(self.model, version, len(parts), next(iter(parts.values())).num_chunks))
        return Assembled(self.model, chunk.version, blob)
