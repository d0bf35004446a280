"""Weight updates (trainer -> rollout workers): inline safetensors chunks, or one URI."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Annotated, ClassVar, Literal

from pydantic import Field, ValidationInfo, field_validator

from .base import Id, Record, UnixTime

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class WeightIntegrityError(ValueError):
    """Chunks that do not add up to the announced blob."""


class WeightUpdate(Record):
    """Chunk `chunk_index` of `num_chunks` of policy `version`; `sha256` is of the whole blob.

    Exactly one of `data` (this chunk's bytes) and `uri` (where the whole blob lies, for models
    too large for the topic; then `num_chunks` is 1) is set. `payload` says what the blob replaces:
    the whole weights, or only a LoRA adapter over the base weights the worker already holds.
    """

    kind: ClassVar[str] = "weight_update"
    id_field: ClassVar[str | None] = "model"

    model: Id
    version: Annotated[int, Field(ge=0)]
    chunk_index: Annotated[int, Field(ge=0)] = 0
    num_chunks: Annotated[int, Field(ge=1)] = 1
    total_bytes: Annotated[int, Field(ge=0)]
    sha256: Sha256
    format: Literal["safetensors"] = "safetensors"
    payload: Literal["full", "adapter"] = "full"
    data: bytes | None = None
    uri: Annotated[str, Field(min_length=1)] | None = Field(default=None, validate_default=True)
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

    @field_validator("uri")
    @classmethod
    def _data_xor_uri(cls, uri: str | None, info: ValidationInfo) -> str | None:
        if "data" not in info.data:  # data itself failed; its error says why
            return uri
        if (uri is None) == (info.data["data"] is None):
            raise ValueError("exactly one of data and uri must be set")
        if uri is not None and info.data.get("num_chunks", 1) != 1:
            raise ValueError(f"with a uri num_chunks must be 1, got {info.data['num_chunks']}")
        return uri


def chunk_weights(model: str, version: int, blob: bytes, chunk_bytes: int,
                  payload: Literal["full", "adapter"] = "full") -> list[WeightUpdate]:
    """Split `blob` into inline chunks of at most `chunk_bytes` (an empty blob: one empty chunk)."""
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be >= 1, got {chunk_bytes}")
    digest = hashlib.sha256(blob).hexdigest()
    starts = range(0, len(blob), chunk_bytes) or range(1)
    return [
        WeightUpdate(
            model=model,
            version=version,
            chunk_index=i,
            num_chunks=len(starts),
            total_bytes=len(blob),
            sha256=digest,
            data=blob[start : start + chunk_bytes],
            payload=payload,
        )
        for i, start in enumerate(starts)
    ]


def weights_by_uri(model: str, version: int, uri: str, total_bytes: int, sha256: str,
                   payload: Literal["full", "adapter"] = "full") -> WeightUpdate:
    """A single update that points at the whole blob instead of carrying it."""
    return WeightUpdate(model=model, version=version, total_bytes=total_bytes, sha256=sha256, uri=uri,
                        payload=payload)


def verify_weights(blob: bytes, update: WeightUpdate) -> None:
    """Raise WeightIntegrityError unless `blob` has the size and sha256 `update` announces."""
    if len(blob) != update.total_bytes:
        raise WeightIntegrityError(
            f"{update.model} v{update.version}: {len(blob)} bytes, expected total_bytes {update.total_bytes}"
        )
    digest = hashlib.sha256(blob).hexdigest()
    if digest != update.sha256:
        raise WeightIntegrityError(
            f"{update.model} v{update.version}: sha256 {digest} != announced {update.sha256}"
        )


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
                f"{name} (model, version, num_chunks, total_bytes and sha256 must all match)"
            )
        if chunk.data is None:
            raise WeightIntegrityError(f"{name} lies at {chunk.uri}: fetch it, then verify_weights()")
        seen = parts.setdefault(chunk.chunk_index, chunk.data)
        if seen != chunk.data:
            index = chunk.chunk_index
            raise WeightIntegrityError(f"{name}: chunk {index} delivered twice with different bytes")
    missing = sorted(set(range(first.num_chunks)) - parts.keys())
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        raise WeightIntegrityError(f"{name}: missing {len(missing)} of {first.num_chunks} chunks: {shown}")
    blob = b"".join(parts[i] for i in range(first.num_chunks))
    verify_weights(blob, first)
    return blob
