"""Bringing an announced version's buckets into a local staging directory, verified bucket by bucket.

Nothing here touches the engine: a version is staged whole (on disk, not in memory) and verified
before the worker loads it, so a bad one is refused while the engine keeps its weights. Staging
also keeps a version the trainer garbage-collects mid-load: a hard link (or copy) outlives the file.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from undertow.kernel import broadcast
from undertow.kernel.models.weights import file_header, read_header
from undertow.schemas import Bucket, WeightIntegrityError, WeightUpdate, verify_manifest

from undertow.rollout.weights import Staged

READ_BYTES = 8 << 20


def fetch_files(update: WeightUpdate, staging_root: str | None = None) -> Staged:
    """Stage the buckets of a `files` announcement from its fsspec `uri`; raise WeightIntegrityError
    ("missing", "checksum", "manifest") for anything that does not match the announcement."""
    import fsspec

    assert update.manifest is not None and update.uri is not None
    verify_manifest(update)
    fs, root = fsspec.core.url_to_fs(update.uri)
    directory = Path(tempfile.mkdtemp(prefix=f"undertow-{update.model}-v{update.version}-", dir=staging_root))
    try:
        files = []
        for bucket in update.manifest:
            target = directory / bucket.file
            source = f"{root.rstrip('/')}/{bucket.file}"
            try:
                digest = _stage(fs, source, target)
            except FileNotFoundError:
                raise WeightIntegrityError(f"{_name(update)}: {update.uri}/{bucket.file} does not exist (a version "
                                           "half written, or collected before it was read)", "missing") from None
            _check(update, bucket, target.stat().st_size, digest, lambda: file_header(target))
            files.append(target)
        return Staged(update.model, update.version, update.payload, files, directory, "files")
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise


def receive_broadcast(update: WeightUpdate, store_timeout_s: float, staging_root: str | None = None) -> Staged | None:
    """Join the version's gloo group and stage the buckets it sends; None when the group had closed
    (the `files` announcement that follows brings the version). A vanished trainer raises
    WeightIntegrityError("broadcast") after the timeout."""
    assert update.manifest is not None and update.rendezvous is not None
    verify_manifest(update)
    directory = Path(tempfile.mkdtemp(prefix=f"undertow-{update.model}-v{update.version}-", dir=staging_root))
    try:
        try:
            store = broadcast.connect(update.rendezvous, store_timeout_s)
            member = broadcast.join(store, update.version, store_timeout_s)
            if member is None:
                shutil.rmtree(directory, ignore_errors=True)
                return None
            pg = broadcast.group(store, update.version, *member, store_timeout_s)
            files = []
            for bucket, data in zip(update.manifest, broadcast.receive(pg, [b.bytes for b in update.manifest])):
                target = directory / bucket.file
                target.write_bytes(data)
                _check(update, bucket, len(data), hashlib.sha256(data).hexdigest(),
                       lambda: read_header(bytes(data[:_header_end(data)])))
                files.append(target)
        except WeightIntegrityError:
            raise
        except Exception as e:  # torch.distributed's errors (timeouts, a closed peer) and the rest alike
            raise WeightIntegrityError(f"{_name(update)}: broadcast from {update.rendezvous} failed "
                                       f"({type(e).__name__}: {e})", "broadcast") from None
        return Staged(update.model, update.version, update.payload, files, directory, "broadcast")
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise


def _stage(fs: object, source: str, target: Path) -> str:
    """Link (same local filesystem) or copy `source` to `target`; the sha256 of its bytes."""
    digest = hashlib.sha256()
    local = getattr(fs, "protocol", None) in ("file", ("file", "local"))
    if local:
        try:
            os.link(source, target)
        except FileNotFoundError:
            raise
        except OSError:  # another filesystem (a missing source is not: it propagates): copy below
            local = False
    if local:
        with open(target, "rb") as f:
            while block := f.read(READ_BYTES):
                digest.update(block)
        return digest.hexdigest()
    with fs.open(source, "rb") as src, open(target, "wb") as dst:  # type: ignore[attr-defined]
        while block := src.read(READ_BYTES):
            digest.update(block)
            dst.write(block)
    return digest.hexdigest()


def _check(update: WeightUpdate, bucket: Bucket, size: int, digest: str,
           header_of: Callable[[], tuple[dict, dict]]) -> None:
    where = f"{_name(update)} {bucket.file}"
    if size != bucket.bytes:
        raise WeightIntegrityError(f"{where}: {size} bytes, the manifest says {bucket.bytes}", "checksum")
    if digest != bucket.sha256:
        raise WeightIntegrityError(f"{where}: sha256 {digest} != manifest {bucket.sha256}", "checksum")
    try:
        header, _ = header_of()  # read only once the bytes are known to be the announced ones
    except ValueError as e:
        raise WeightIntegrityError(f"{where}: {e}", "manifest") from None
    declared = {t.name: (t.dtype, tuple(t.shape)) for t in bucket.tensors}
    if header != declared:
        differ = sorted(set(header.items()) ^ set(declared.items()))[:3]
        raise WeightIntegrityError(f"{where}: tensors differ from the manifest ({differ})", "manifest")


def _header_end(data: memoryview) -> int:
    return 8 + int.from_bytes(bytes(data[:8]), "little") if len(data) >= 8 else len(data)


def _name(update: WeightUpdate) -> str:
    return f"{update.model} v{update.version}"
