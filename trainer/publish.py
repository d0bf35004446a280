"""Weight publishing: every policy version is announced on `<ns>.weights`; a transport carries its bytes.

A publisher first `pack`s the gathered tensors (on rank 0, inside the gather, so it must copy what
it keeps), then `publish`es them as a version. `trainer.weights.transport` picks one:
- `kafka`: one safetensors blob in inline chunks on the topic (small models, one machine);
- `files`: safetensors buckets in a version directory under `trainer.weights.uri` (any fsspec URI),
  written under a temporary name and renamed, manifest last; announced once complete;
- `broadcast`: the buckets over a gloo group to the workers that join, from a thread of its own (a
  slow or dead worker never holds up training); then the same files for everyone who was not in it.

Keys: an announcement is keyed by model, so the compacted topic keeps the newest one per model; an
inline chunk by model and index, so compaction keeps the newest version's chunks.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from undertow.kernel import broadcast
from undertow.kernel.models.weights import read_header, to_buckets
from undertow.kernel.registry import Registry
from undertow.schemas import Bucket, MetricEvent, TensorMeta, WeightUpdate, announce_buckets, chunk_weights
from undertow.streams import KafkaSettings, RecordProducer, Topics

from .config import WeightsConfig

log = logging.getLogger(__name__)

VERSION_PREFIX = "v"
METRICS_COMPONENT = "trainer-weights"


@dataclass
class Published:
    version: int
    bytes: int
    records: int
    transport: str


class Publisher(Protocol):
    def pack(self, tensors: dict[str, Any], metadata: dict[str, str] | None) -> Any:
        """What to keep of the gathered tensors (a copy: they may be freed or trained on afterwards)."""

    def publish(self, version: int, packed: Any) -> Published:
        """Announce `version` and send its bytes (the broadcast publisher: hand them to its thread)."""

    def close(self) -> None:
        """Finish what was handed over, then release connections."""


publishers: Registry[type] = Registry("weights transport")


def build_publisher(model: str, cfg: WeightsConfig, producer: RecordProducer, topics: Topics, payload: str,
                    settings: KafkaSettings, tokenizer: str | None = None) -> Publisher:
    """The configured transport's publisher for `model`'s versions on `topics.weights`, each version
    announced with the trainer's `tokenizer` fingerprint."""
    return publishers.get(cfg.transport)(model, cfg, producer, topics, payload, settings, tokenizer)


def publish_weights(producer: RecordProducer, topic: str, updates: list[WeightUpdate]) -> Published:
    """Send records of one version with their compaction keys, and wait for acks."""
    for update in updates:
        key = update.model if update.data is None else f"{update.model}#{update.chunk_index}"
        producer.send(topic, update, key=key)
    producer.flush()
    first = updates[0]
    return Published(first.version, first.total_bytes, len(updates), first.transport)


@publishers.register("kafka")
class KafkaPublisher:
    """Inline chunks of one safetensors blob."""

    def __init__(self, model: str, cfg: WeightsConfig, producer: RecordProducer, topics: Topics, payload: str,
                 settings: KafkaSettings, tokenizer: str | None = None):
        self.model, self.cfg, self.producer, self.topics, self.payload = model, cfg, producer, topics, payload
        self.tokenizer = tokenizer

    def pack(self, tensors: dict[str, Any], metadata: dict[str, str] | None) -> bytes:
        from safetensors.torch import save

        return save(tensors, metadata=metadata)

    def publish(self, version: int, packed: bytes) -> Published:
        chunks = chunk_weights(self.model, version, packed, self.cfg.chunk_bytes, self.payload, self.tokenizer)
        return publish_weights(self.producer, self.topics.weights, chunks)

    def close(self) -> None:
        pass


def describe(file: str, blob: bytes) -> Bucket:
    """A bucket's manifest entry, from its own header."""
    header, _ = read_header(blob)
    tensors = tuple(TensorMeta(name=n, dtype=d, shape=s) for n, (d, s) in header.items())
    return Bucket(file=file, bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest(), tensors=tensors)


def manifest_of(buckets: list[bytes]) -> list[Bucket]:
    return [describe(f"bucket-{i:04d}.safetensors", blob) for i, blob in enumerate(buckets)]


@publishers.register("files")
class FilesPublisher:
    """Version directories `<uri>/<model>/v00000012/` of safetensors buckets and a manifest.json."""

    def __init__(self, model: str, cfg: WeightsConfig, producer: RecordProducer, topics: Topics, payload: str,
                 settings: KafkaSettings, tokenizer: str | None = None):
        import fsspec

        self.model, self.cfg, self.producer, self.topics, self.payload = model, cfg, producer, topics, payload
        self.tokenizer = tokenizer
        assert cfg.uri is not None  # WeightsConfig requires it for this transport
        uri = cfg.uri if "://" in cfg.uri else os.path.abspath(os.path.expanduser(cfg.uri))
        self.fs, root = fsspec.core.url_to_fs(uri)
        self.root = f"{root.rstrip('/')}/{model}"
        self.base_uri = f"{uri.rstrip('/')}/{model}"

    def pack(self, tensors: dict[str, Any], metadata: dict[str, str] | None) -> list[bytes]:
        # An adapter is applied whole (peft), so it is one bucket however large.
        size = self.cfg.bucket_bytes if self.payload == "full" else 1 << 62
        return to_buckets(tensors, size, metadata)

    def publish(self, version: int, packed: list[bytes]) -> Published:
        manifest = self.write(version, packed)
        update = announce_buckets(self.model, version, manifest, transport="files", uri=self.version_uri(version),
                                  payload=self.payload, tokenizer=self.tokenizer)
        return publish_weights(self.producer, self.topics.weights, [update])

    def close(self) -> None:
        pass

    def version_uri(self, version: int) -> str:
        return f"{self.base_uri}/{VERSION_PREFIX}{version:08d}"

    def write(self, version: int, buckets: list[bytes], manifest: list[Bucket] | None = None) -> list[Bucket]:
        """Write a version's buckets, then its manifest, under a temporary name; rename it into place;
        delete versions beyond `keep`. Readers never see a version directory half written."""
        manifest = manifest or manifest_of(buckets)
        final = f"{self.root}/{VERSION_PREFIX}{version:08d}"
        partial = f"{final}.partial-{uuid.uuid4().hex[:8]}"
        self.fs.makedirs(partial, exist_ok=True)
        for bucket, blob in zip(manifest, buckets):
            self.fs.pipe_file(f"{partial}/{bucket.file}", blob)
        self.fs.pipe_file(f"{partial}/manifest.json", json.dumps([b.model_dump() for b in manifest]).encode())
        if self.fs.exists(final):  # the same version again, from a trainer resumed from its checkpoint
            self.fs.rm(final, recursive=True)
        self.fs.mv(partial, final, recursive=True)
        self._collect(version)
        return manifest

    def _collect(self, current: int) -> None:
        """Keep `current` and the `keep - 1` newest versions below it; versions above it belong to
        steps a resumed trainer lost, and partial directories to a trainer that died writing."""
        versions, partials = [], []
        for path in self.fs.ls(self.root, detail=False):
            name = path.rstrip("/").rsplit("/", 1)[-1]
            if ".partial-" in name:
                partials.append(path)
            elif name.startswith(VERSION_PREFIX) and name[1:].isdigit():
                versions.append((int(name[1:]), path))
        kept = {current} | {v for v, _ in sorted(v for v in versions if v[0] < current)[-(self.cfg.keep - 1):]}
        for path in [p for v, p in versions if v not in kept] + partials:
            try:
                self.fs.rm(path, recursive=True)
            except FileNotFoundError:
                pass


@publishers.register("broadcast")
class BroadcastPublisher:
    """The buckets over a gloo group per version, from a thread; then files for the others."""

    def __init__(self, model: str, cfg: WeightsConfig, producer: RecordProducer, topics: Topics, payload: str,
                 settings: KafkaSettings, tokenizer: str | None = None):
        self.model, self.cfg, self.topics, self.payload = model, cfg, topics, payload
        self.producer = RecordProducer(settings)  # its own: the thread sends while the trainer does
        self.files = FilesPublisher(model, cfg, self.producer, topics, payload, settings, tokenizer)
        bc = cfg.broadcast
        self.store = broadcast.host_store(bc.host, bc.port, bc.timeout_s)
        self.rendezvous = f"{bc.host}:{self.store.port}"
        self.last: int | None = None  # the version broadcast before
        self.rounds: list[dict[str, Any]] = []  # what each version's broadcast did (tests, metrics)
        self._next: tuple[int, list[bytes]] | None = None
        self._cond = threading.Condition()
        self._closing = False
        self._thread = threading.Thread(target=self._serve, name="weights-broadcast", daemon=True)
        self._thread.start()

    def pack(self, tensors: dict[str, Any], metadata: dict[str, str] | None) -> list[bytes]:
        return self.files.pack(tensors, metadata)

    def publish(self, version: int, packed: list[bytes]) -> Published:
        with self._cond:  # a version not yet started is superseded by a newer one
            self._next = (version, packed)
            self._cond.notify_all()
        return Published(version, sum(len(b) for b in packed), 0, "broadcast")

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        bc = self.cfg.broadcast
        self._thread.join(timeout=bc.join_timeout_s + bc.timeout_s + 600)
        self.producer.flush()
        self.producer.close()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while self._next is None and not self._closing:
                    self._cond.wait()
                if self._next is None:
                    return
                (version, buckets), self._next = self._next, None
            try:
                self._round(version, buckets)
            except Exception:  # never lose the thread: the next version tries again
                log.exception("weights %s v%d: broadcast round failed", self.model, version)

    def _round(self, version: int, buckets: list[bytes]) -> None:
        bc = self.cfg.broadcast
        manifest = manifest_of(buckets)
        announcement = announce_buckets(self.model, version, manifest, transport="broadcast",
                                        rendezvous=self.rendezvous, payload=self.payload,
                                        tokenizer=self.files.tokenizer)
        publish_weights(self.producer, self.topics.weights, [announcement])
        # Everyone who tried to join the last version, in time or late, is expected now; one that
        # died is not counted after the round it missed.
        expected = broadcast.joined(self.store, self.last) if self.last is not None else 0
        started = time.perf_counter()
        size = broadcast.close_membership(self.store, version, expected, bc.join_timeout_s)
        sent, error = False, None
        if size > 1:
            try:
                pg = broadcast.group(self.store, version, 0, size, bc.timeout_s)
                broadcast.send(pg, buckets)
                sent = True
            except Exception as e:  # a peer vanished or stalled: everyone falls back to the files below
                error = f"{type(e).__name__}: {e}"
                log.warning("weights %s v%d: broadcast to %d workers failed (%s); they take the files", self.model,
                            version, size - 1, error)
        self.last = version
        seconds = time.perf_counter() - started
        self.rounds.append({"version": version, "members": size - 1, "expected": expected, "sent": sent,
                            "error": error})
        self.producer.send(self.topics.metrics, MetricEvent(component=METRICS_COMPONENT, step=version, values={
            "broadcast_members": float(size - 1), "broadcast_expected": float(expected),
            "broadcast_sent": float(sent), "broadcast_s": seconds}), key=METRICS_COMPONENT)
        self.files.write(version, buckets, manifest)
        files = announce_buckets(self.model, version, manifest, transport="files",
                                 uri=self.files.version_uri(version), payload=self.payload,
                                 tokenizer=self.files.tokenizer)
        publish_weights(self.producer, self.topics.weights, [files])
