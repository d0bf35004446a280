"""The `files` transport: safetensors buckets in a version directory under `uri`, announced once complete.

`uri` is any fsspec URI (a shared directory, an object store). A version is written under a
temporary name, manifest last, and renamed into `<uri>/<model>/v00000012/`; the `keep` newest
versions stay. A worker stages the buckets (hard link or copy) and verifies each against the
manifest before it loads any.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from pydantic import Field

from undertow.kernel.disk import stop_when_full
from undertow.kernel.models.weights import Blob, file_header, to_buckets
from undertow.schemas import Bucket, WeightIntegrityError, WeightUpdate, announce_buckets, verify_manifest

from .api import Lost, Published, Receiving, Sending, Settings, Transport, publish_weights, transports
from .ready import Staged
from .staging import check_bucket, manifest_of, name_of, stage_file, staging_directory

NAME = "files"
VERSION_PREFIX = "v"


class FilesSettings(Settings):
    """`trainer.weights` fields the files transport reads (broadcast too: it writes the same files)."""

    uri: str | None = Field(None, description="directory for versions, any fsspec URI (files, broadcast)")
    bucket_bytes: int = Field(64 << 20, ge=1, description="tensor bytes per bucket file (files, broadcast)")
    keep: int = Field(3, ge=2, description="versions kept under uri; older ones are deleted (a worker may still "
                                           "be fetching the one before the newest)")


class FilesSender:
    """Version directories `<uri>/<model>/v00000012/` of safetensors buckets and a manifest.json (a shadow
    trainer's under `<uri>/<model>.shadow-<name>/`, beside the run's)."""

    def __init__(self, sending: Sending):
        import fsspec

        self.s = sending
        cfg = sending.cfg
        assert cfg.uri is not None  # Files.check_settings requires it
        uri = cfg.uri if "://" in cfg.uri else os.path.abspath(os.path.expanduser(cfg.uri))
        self.fs, root = fsspec.core.url_to_fs(uri)
        shadow = sending.topics.shadow if sending.topics is not None else None
        own = sending.model if shadow is None else f"{sending.model}.shadow-{shadow}"
        self.root = f"{root.rstrip('/')}/{own}"
        self.base_uri = f"{uri.rstrip('/')}/{own}"

    def pack(self, tensors: dict[str, Any], metadata: dict[str, str] | None) -> list[Blob]:
        return to_buckets(tensors, self.bucket_bytes, metadata)

    @property
    def bucket_bytes(self) -> int:
        # An adapter is applied whole (peft), so it is one bucket however large.
        return self.s.cfg.bucket_bytes if self.s.payload == "full" else 1 << 62

    def publish(self, version: int, packed: list[Blob]) -> Published:
        manifest = self.write(version, packed)
        return publish_weights(self.s.producer, self.s.topics.weights, [self.announcement(version, manifest)])

    def close(self) -> None:
        pass

    def announcement(self, version: int, manifest: list[Bucket]) -> WeightUpdate:
        return announce_buckets(self.s.model, version, manifest, transport=NAME, uri=self.version_uri(version),
                                payload=self.s.payload, tokenizer=self.s.tokenizer)

    def version_uri(self, version: int) -> str:
        return f"{self.base_uri}/{VERSION_PREFIX}{version:08d}"

    def write(self, version: int, buckets: list[Blob], manifest: list[Bucket] | None = None) -> list[Bucket]:
        """Write a version's buckets, then its manifest, under a temporary name; rename it into place;
        delete versions beyond `keep`. Readers never see a version directory half written. A full disk
        removes the partial directory and raises DiskFull (no announcement: workers keep the version they have)."""
        manifest = manifest or manifest_of(buckets)
        final = f"{self.root}/{VERSION_PREFIX}{version:08d}"
        partial = f"{final}.partial-{uuid.uuid4().hex[:8]}"
        with stop_when_full(f"weights {self.s.model} v{version}", self.base_uri, cleanup=lambda: self._remove(partial)):
            self.fs.makedirs(partial, exist_ok=True)
            for bucket, blob in zip(manifest, buckets):
                with self.fs.open(f"{partial}/{bucket.file}", "wb") as f:  # any fsspec file takes a buffer
                    f.write(blob)
            self.fs.pipe_file(f"{partial}/manifest.json", json.dumps([b.model_dump() for b in manifest]).encode())
        if self.fs.exists(final):  # the same version again, from a trainer resumed from its checkpoint
            self.fs.rm(final, recursive=True)
        self.fs.mv(partial, final, recursive=True)
        self._collect(version)
        return manifest

    def _remove(self, path: str) -> None:
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

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
        kept = {current} | {v for v, _ in sorted(v for v in versions if v[0] < current)[-(self.s.cfg.keep - 1):]}
        for path in [p for v, p in versions if v not in kept] + partials:
            try:
                self.fs.rm(path, recursive=True)
            except FileNotFoundError:
                pass


def fetch_files(update: WeightUpdate, staging_root: str | None = None) -> Staged:
    """Stage the buckets of a `files` announcement from its fsspec `uri`; raise WeightIntegrityError
    ("missing", "checksum", "manifest") for anything that does not match the announcement."""
    import fsspec

    assert update.manifest is not None and update.uri is not None
    verify_manifest(update)
    fs, root = fsspec.core.url_to_fs(update.uri)
    with staging_directory(update, staging_root) as directory:
        files = []
        for bucket in update.manifest:
            target = directory / bucket.file
            try:
                digest = stage_file(fs, f"{root.rstrip('/')}/{bucket.file}", target)
            except FileNotFoundError:
                raise WeightIntegrityError(f"{name_of(update)}: {update.uri}/{bucket.file} does not exist (a version "
                                           "half written, or collected before it was read)", "missing") from None
            check_bucket(update, bucket, target.stat().st_size, digest, lambda: file_header(target))
            files.append(target)
        return Staged(update.model, update.version, update.payload, files, directory, NAME)


class FilesReceiver:
    def __init__(self, receiving: Receiving):
        self.r = receiving

    def receive(self, update: WeightUpdate) -> Staged:
        return fetch_files(update, self.r.staging_dir)

    def lost(self) -> list[Lost]:
        return []


@transports.register(NAME)
class Files(Transport):
    """Buckets under a directory any fsspec URI names: large models, many machines."""

    needs = ("manifest", "uri")
    sender, receiver = FilesSender, FilesReceiver

    @classmethod
    def check_settings(cls, cfg: Any, name: str) -> None:
        if cfg.uri is None:
            raise ValueError(f"uri: transport {name} needs a directory for the versions")
