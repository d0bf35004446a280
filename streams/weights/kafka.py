"""The `kafka` transport: a version as one safetensors blob in inline chunks on the weights topic.

For small models on one machine. Each chunk is keyed by model and index, so compaction keeps the
newest version's chunks; the receiver reassembles them, in any order, and checks size and sha256.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import Field

from undertow.schemas import WeightUpdate, assemble_weights, chunk_weights

from .api import Lost, Published, Receiving, Sending, Settings, Transport, publish_weights, transports
from .ready import Assembled

MAX_CHUNK_BYTES = 8 << 20  # well below the topic's max.message.bytes (streams/topics.py)


class InlineSettings(Settings):
    """`trainer.weights` fields the kafka transport reads."""

    chunk_bytes: int = Field(4 << 20, ge=1024, le=MAX_CHUNK_BYTES, description="inline chunk size (kafka)")


class KafkaSender:
    """Inline chunks of one safetensors blob."""

    def __init__(self, sending: Sending):
        self.s = sending

    def pack(self, tensors: dict[str, Any], metadata: dict[str, str] | None) -> bytes:
        from safetensors.torch import save

        return save(tensors, metadata=metadata)

    def publish(self, version: int, packed: bytes) -> Published:
        s = self.s
        chunks = chunk_weights(s.model, version, packed, s.cfg.chunk_bytes, s.payload, s.tokenizer)
        return publish_weights(s.producer, s.topics.weights, chunks)

    def close(self) -> None:
        pass


@dataclass
class Incomplete:
    """A version given up on: a newer one was complete before all of its chunks came."""

    model: str
    version: int
    received: int
    num_chunks: int
    superseded_by: int = -1  # the version complete before it


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
            self.incomplete.append(Incomplete(self.model, version, len(parts), next(iter(parts.values())).num_chunks,
                                              chunk.version))
        return Assembled(self.model, chunk.version, blob)


class KafkaReceiver:
    """Reassembles a version from its chunks (stateful: one per worker)."""

    def __init__(self, receiving: Receiving):
        self.assembler = WeightAssembler(receiving.model)

    def receive(self, update: WeightUpdate) -> Assembled | None:
        return self.assembler.add(update)

    def lost(self) -> list[Lost]:
        lost, self.assembler.incomplete = self.assembler.incomplete, []
        return [Lost(i.model, i.version, "incomplete",
                     f"{i.received} of {i.num_chunks} chunks arrived before v{i.superseded_by} was complete")
                for i in lost]


@transports.register("kafka")
class Kafka(Transport):
    """Inline chunks on the topic: small models, one machine."""

    needs = ("data",)
    sender, receiver = KafkaSender, KafkaReceiver
