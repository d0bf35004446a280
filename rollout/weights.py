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
class WeightAssembler:
    """Collects chunks of one model's versions; returns a version once all its chunks are in.

    Raises WeightIntegrityError (from `schemas.assemble_weights`) for a version whose chunks do not
    add up; that version is forgotten, the caller keeps its weights. Versions at or below the
    newest one already assembled are ignored (redeliveries, or a late chunk of an old version).
    """

    model: str
    newest: int = -1
    pending: dict[int, dict[int, WeightUpdate]] = field(default_factory=dict)

    def add(self, chunk: WeightUpdate) -> Assembled | None:
        if chunk.model != self.model or chunk.version <= self.newest:
            return None
        chunks = self.pending.setdefault(chunk.version, {})
        chunks.setdefault(chunk.chunk_index, chunk)
        if len(chunks) < chunk.num_chunks:
            return None
        del self.pending[chunk.version]
        blob = assemble_weights(chunks.values())
        self.newest = chunk.version
        # Older partial versions can no longer be wanted.
        self.pending = {v: c for v, c in self.pending.items() if v > chunk.version}
        return Assembled(self.model, chunk.version, blob)
