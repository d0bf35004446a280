"""Weight broadcast: one WeightUpdate per policy version, inline chunks or a URI on shared storage."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from schemas import WeightUpdate, chunk_weights, weights_by_uri
from streams import RecordProducer


@dataclass
class Published:
    version: int
    bytes: int
    chunks: int
    uri: str | None


def weight_updates(model: str, version: int, blob: bytes, *, chunk_bytes: int, weights_dir: Path | None,
                   uri_above_bytes: int, payload: str = "full") -> list[WeightUpdate]:
    """Inline chunks, or (large blob and shared storage configured) the blob written to a file and its URI."""
    if weights_dir is None or len(blob) <= uri_above_bytes:
        return chunk_weights(model, version, blob, chunk_bytes, payload)
    weights_dir.mkdir(parents=True, exist_ok=True)
    path = weights_dir / f"{model}-v{version:08d}.safetensors"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(blob)
    os.replace(tmp, path)  # readers never see a half-written file
    return [weights_by_uri(model, version, path.resolve().as_uri(), len(blob), hashlib.sha256(blob).hexdigest(),
                           payload)]


def publish_weights(producer: RecordProducer, topic: str, updates: list[WeightUpdate]) -> Published:
    """Send every chunk keyed by model name (one partition keeps them in order), and wait for acks."""
    for update in updates:
        producer.send(topic, update, key=update.model)
    producer.flush()
    first = updates[0]
    return Published(first.version, first.total_bytes, len(updates), first.uri)
