"""Staging a version's buckets locally and verifying each against its manifest entry (files, broadcast).

Nothing here touches an engine: a version is staged whole (as files: on disk, or in a memory filesystem for a broadcast) and verified
before the worker loads it, so a bad one is refused while the engine keeps its weights. Staging
also keeps a version the trainer garbage-collects mid-load: a hard link (or copy) outlives the file.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from undertow.kernel.models.weights import Blob, read_header
from undertow.schemas import Bucket, TensorMeta, WeightIntegrityError, WeightUpdate

READ_BYTES = 8 << 20


def describe(file: str, blob: Blob) -> Bucket:
    """A bucket's manifest entry, from its own header."""
    header, _ = read_header(blob)
    tensors = tuple(TensorMeta(name=n, dtype=d, shape=s) for n, (d, s) in header.items())
    return Bucket(file=file, bytes=len(blob), sha256=hashlib.sha256(blob).hexdigest(), tensors=tensors)


def bucket_file(index: int) -> str:
    """The file name of a version's bucket `index` (in its directory, and in its manifest)."""
    return f"bucket-{index:04d}.safetensors"


def manifest_of(buckets: list[Blob]) -> list[Bucket]:
    """Every bucket's entry, hashed on all cores (sha256 releases the GIL): a version's hashing is
    on the path from the trainer's publish to the workers' swap."""
    names = [bucket_file(i) for i in range(len(buckets))]
    if len(buckets) < 2:
        return [describe(n, b) for n, b in zip(names, buckets)]
    with ThreadPoolExecutor(min(len(buckets), os.cpu_count() or 1), thread_name_prefix="weights-hash") as pool:
        return list(pool.map(describe, names, buckets))


@contextmanager
def staging_directory(update: WeightUpdate, staging_root: str | None) -> Iterator[Path]:
    """A fresh directory for `update`'s version, removed again if staging fails."""
    # The process's id in the name: what a killed worker left is found and removed (sweep_dead).
    prefix = f"undertow-{update.model}-v{update.version}-p{os.getpid()}-"
    directory = Path(tempfile.mkdtemp(prefix=prefix, dir=staging_root))
    try:
        yield directory
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise


def stage_file(fs: object, source: str, target: Path) -> str:
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


def check_bucket(update: WeightUpdate, bucket: Bucket, size: int, digest: str,
                 header_of: Callable[[], tuple[dict, dict]]) -> None:
    """Raise WeightIntegrityError ("checksum", "manifest") unless the bytes are the bucket's."""
    where = f"{name_of(update)} {bucket.file}"
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


def name_of(update: WeightUpdate) -> str:
    return f"{update.model} v{update.version}"


# A broadcast version is staged in memory where there is room: it is loaded right after, then removed.

MEMORY_ROOT = "/dev/shm"  # a tmpfs on Linux: files there are memory


def in_memory(update: WeightUpdate, staging_root: str | None) -> str | None:
    """Where a broadcast version is staged: in memory (MEMORY_ROOT) when there is room for it twice
    over, else `staging_root`. It is loaded right after and removed, so writing it to a disk would be
    waste; and the engines take files, which memory files are too."""
    try:
        sweep_dead(Path(MEMORY_ROOT))
        room = memory_room()
    except OSError:  # no such directory (macOS, Windows)
        return staging_root
    return MEMORY_ROOT if room > 2 * update.total_bytes else staging_root


def sweep_dead(root: Path) -> None:
    """Remove the staging directories under `root` of processes that no longer run (a worker killed
    while it held a version): in memory they would hold that memory until the machine restarts."""
    for entry in root.glob("undertow-*-p*-*"):
        pid = re.search(r"-p(\d+)-[^-]*$", entry.name)
        if pid is not None and entry.is_dir() and not _running(int(pid.group(1))):
            shutil.rmtree(entry, ignore_errors=True)


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


def memory_room() -> int:
    """Bytes free in MEMORY_ROOT, and no more than the memory available: a tmpfs is sized like the
    machine's memory, not like what other processes leave of it, and its pages are not reclaimable."""
    room = shutil.disk_usage(MEMORY_ROOT).free
    try:
        with open("/proc/meminfo") as f:
            available = next(int(line.split()[1]) << 10 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError, IndexError):
        return room
    return min(room, available)


def file_buffer(target: Path, size: int) -> memoryview:
    """A writable view of a new file of `size` bytes (memory-mapped): what is received into it is in
    the file, with no copy."""
    with open(target, "w+b") as f:
        f.truncate(size)
        return memoryview(mmap.mmap(f.fileno(), size)) if size else memoryview(bytearray())
