"""Weight updates (trainer -> rollout workers): one announcement per policy version, and where its bytes are.

The `transport` names how the bytes travel (streams/weights/: one module each, and which of `data`,
`manifest`, `uri`, `rendezvous` its announcements carry, checked on receipt): inline `data` in
chunks of one safetensors blob on the topic itself, or a `manifest` of buckets found elsewhere.

Every bucket carries its own sha256 and tensor list, so a worker verifies bucket by bucket and
never needs the whole version in memory; `sha256` of a manifest announcement fingerprints the
bucket digests, so a manifest altered on the way is refused too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from .base import Id, Record, UnixTime

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Payload = Literal["full", "adapter"]


class WeightIntegrityError(ValueError):
    """Bytes that do not add up to what was announced; `reason` is the rejected record's reason."""

    def __init__(self, message: str, reason: str = "checksum"):
        super().__init__(message)
        self.reason = reason


class TensorMeta(BaseModel):
    """One tensor of a bucket, as its safetensors header declares it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, Field(min_length=1)]
    dtype: Annotated[str, Field(min_length=1)]
    shape: tuple[Annotated[int, Field(ge=0)], ...]


class Bucket(BaseModel):
    """One safetensors file of a version: its name in the version's directory, size, digest, tensors."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    file: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]+$")]  # a bare name: never a path out of the directory
    bytes: Annotated[int, Field(ge=0)]
    sha256: Sha256
    tensors: tuple[TensorMeta, ...]


def manifest_digest(manifest: Iterable[Bucket]) -> str:
    """The fingerprint of a manifest: sha256 over its buckets' files, sizes and digests, in order."""
    return hashlib.sha256("".join(f"{b.file}:{b.bytes}:{b.sha256};" for b in manifest).encode()).hexdigest()


class WeightUpdate(Record):
    """Policy `version` of `model`: one inline chunk (`data`), or an announcement of where its bytes are
    (a `manifest` of buckets at `uri` or from `rendezvous`). `payload` says what it replaces: the
    whole weights, or only a LoRA adapter over the base weights the worker already holds."""

    kind: ClassVar[str] = "weight_update"
    id_field: ClassVar[str | None] = "model"

    model: Id
    version: Annotated[int, Field(ge=0)]
    transport: Annotated[str, Field(min_length=1)] = "kafka"  # a registered weights transport
    payload: Payload = "full"
    format: Literal["safetensors"] = "safetensors"
    total_bytes: Annotated[int, Field(ge=0)]
    sha256: Sha256
    # inline chunks
    chunk_index: Annotated[int, Field(ge=0)] = 0
    num_chunks: Annotated[int, Field(ge=1)] = 1
    data: bytes | None = None
    # buckets found elsewhere
    manifest: tuple[Bucket, ...] | None = None
    uri: Annotated[str, Field(min_length=1)] | None = None
    rendezvous: Annotated[str, Field(pattern=r"^[^:\s]+:\d+$")] | None = None
    # The trainer's tokenizer fingerprint (kernel/models/tokenizer.py): a worker that tokenizes
    # otherwise must not generate for it. None from trainers that predate it.
    tokenizer: Annotated[str, Field(pattern=r"^[0-9a-f]{16}$")] | None = None
    created_at: UnixTime

    @field_validator("num_chunks")
    @classmethod
    def _index_inside(cls, num_chunks: int, info: ValidationInfo) -> int:
        index = info.data.get("chunk_index")
        if index is not None and index >= num_chunks:
            raise ValueError(f"chunk_index {index} >= num_chunks {num_chunks}")
        return num_chunks

    @field_validator("data")
    @classmethod
    def _inside_total(cls, data: bytes | None, info: ValidationInfo) -> bytes | None:
        total = info.data.get("total_bytes")
        if data is not None and total is not None and len(data) > total:
            raise ValueError(f"{len(data)} bytes > total_bytes {total}")
        return data

    @model_validator(mode="after")
    def _inline_or_announced(self) -> "WeightUpdate":
        """What holds for every transport; which fields one needs is checked on receipt (streams/weights/)."""
        if self.data is not None and self.manifest is not None:
            raise ValueError("an update carries inline data or a manifest, not both")
        if self.data is None and self.num_chunks != 1:
            raise ValueError(f"an update without inline data has no chunks, got num_chunks {self.num_chunks}")
        if self.manifest is not None:
            if sum(b.bytes for b in self.manifest) != self.total_bytes:
                raise ValueError("total_bytes is not the sum of the manifest's bucket sizes")
            if len({b.file for b in self.manifest}) != len(self.manifest):
                raise ValueError("manifest names a bucket file twice")
        return self


def chunk_weights(model: str, version: int, blob: bytes, chunk_bytes: int, payload: Payload = "full",
                  tokenizer: str | None = None) -> list[WeightUpdate]:
    """Split `blob` into inline chunks of at most `chunk_bytes` (an empty blob: one empty chunk)."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    digest = hashlib.sha256(blob).hexdigest()
    starts = range(0, len(blob), chunk_bytes) or range(1)
    return [
        WeightUpdate(model=model, version=version, chunk_index=i, num_chunks=len(starts), total_bytes=len(blob),
                     sha256=digest, data=blob[start: start + chunk_bytes], payload=payload, tokenizer=tokenizer)
        for i, start in enumerate(starts)
    ]


def announce_buckets(model: str, version: int, manifest: list[Bucket], *, transport: str,
                     uri: str | None = None, rendezvous: str | None = None,
                     payload: Payload = "full", tokenizer: str | None = None) -> WeightUpdate:
    """The announcement of a version whose buckets lie at `uri` or come from `rendezvous`."""
    return WeightUpdate(model=model, version=version, transport=transport, payload=payload,
                        total_bytes=sum(b.bytes for b in manifest), sha256=manifest_digest(manifest),
                        manifest=tuple(manifest), uri=uri, rendezvous=rendezvous, tokenizer=tokenizer)


def verify_weights(blob: bytes, update: WeightUpdate) -> None:
    """Raise WeightIntegrityError unless `blob` has the size and sha256 `update` announces."""
    if len(blob) != update.total_bytes:
        raise WeightIntegrityError(
            f"{update.model} v{update.version}: {len(blob)} bytes, expected total_bytes {update.total_bytes}")
    digest = hashlib.sha256(blob).hexdigest()
    if digest != update.sha256:
        raise WeightIntegrityError(f"{update.model} v{update.version}: sha256 {digest} != announced {update.sha256}")


def verify_manifest(update: WeightUpdate) -> None:
    """Raise WeightIntegrityError unless the announcement's fingerprint is that of its manifest."""
    assert update.manifest is not None
    if manifest_digest(update.manifest) != update.sha256:
        raise WeightIntegrityError(f"{update.model} v{update.version}: the manifest does not match its sha256",
                                   "manifest")


def assemble_weights(chunks: Iterable[WeightUpdate]) -> bytes:
    """Join the inline chunks of one version, in any order, and verify size and checksum.

    A chunk delivered twice with the same bytes is fine (at-least-once delivery).
    """
    chunks = list(chunks)
    if not chunks:
        raise WeightIntegrityError("no chunks given")
    first = chunks[0]
    name = f"{first.model} v{first.version}"
    header = (first.model, first.version, first.num_chunks, first.total_bytes, first.sha256)
    parts: dict[int, bytes] = {}
    for chunk in chunks:
        if (chunk.model, chunk.version, chunk.num_chunks, chunk.total_bytes, chunk.sha256) != header:
            raise WeightIntegrityError(
                f"chunk {chunk.chunk_index} of {chunk.model} v{chunk.version} does not belong with "
                f"{name} (model, version, num_chunks, total_bytes and sha256 must all match)")
        if chunk.data is None:
            raise WeightIntegrityError(f"{name} travels by {chunk.transport}: it has no inline chunks")
        seen = parts.setdefault(chunk.chunk_index, chunk.data)
        if seen != chunk.data:
            raise WeightIntegrityError(f"{name}: chunk {chunk.chunk_index} delivered twice with different bytes")
    missing = sorted(set(range(first.num_chunks)) - parts.keys())
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise WeightIntegrityError(f"{name}: missing {len(missing)} of {first.num_chunks} chunks: {shown}", "missing")
    blob = b"".join(parts[i] for i in range(first.num_chunks))
    verify_weights(blob, first)
    return blob
