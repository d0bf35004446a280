"""Reassembling weight updates from their chunks (pure; the subscriber feeds it records)."""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas import WeightUpdate, assemble_weights


@dataclass
class Assembled:
    """A complete, checksum-verified policy version."""

    model: str
    version: int
    blob: bytes


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
