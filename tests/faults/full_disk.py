"""A size-limited filesystem for tests: real files on the local disk, and a device that has only
`free` bytes left. A write past that writes what fits, then fails with ENOSPC, as a full device does.

Registered with fsspec as `limited://`, so that any component that takes a URI (the archive's
root, the files transport's uri) writes through it unchanged. Mounting a small tmpfs would need root.
"""

from __future__ import annotations

import errno
import os

import fsspec
from fsspec.implementations.local import LocalFileOpener, LocalFileSystem

PROTOCOL = "limited"


class _QuotaFile(LocalFileOpener):
    def write(self, data) -> int:
        n = memoryview(data).nbytes
        if n > LimitedFileSystem.free:
            fits = LimitedFileSystem.free
            if fits:
                self.f.write(memoryview(data).cast("B")[:fits])
            LimitedFileSystem.free = 0
            LimitedFileSystem.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path)
        LimitedFileSystem.free -= n
        return self.f.write(data)


class LimitedFileSystem(LocalFileSystem):
    """The local filesystem with `free` bytes left on its device (a class attribute: one device)."""

    protocol = PROTOCOL
    free: int = 1 << 40
    refused: int = 0  # writes that met the full device

    def _open(self, path, mode="rb", block_size=None, **kwargs):
        path = self._strip_protocol(path)
        if "w" in mode or "a" in mode or "x" in mode:
            if self.auto_mkdir:
                self.makedirs(self._parent(path), exist_ok=True)
            return _QuotaFile(path, mode, fs=self, **kwargs)
        return super()._open(path, mode, block_size, **kwargs)


def limited(path: os.PathLike | str, free: int) -> str:
    """The `limited://` URI of a local path, on a device with `free` bytes left."""
    fsspec.register_implementation(PROTOCOL, LimitedFileSystem, clobber=True)
    LimitedFileSystem.free, LimitedFileSystem.refused = free, 0
    return f"{PROTOCOL}://{os.path.abspath(path)}"


def files_under(path: os.PathLike | str) -> list[str]:
    """Every file under `path`, relative, sorted."""
    out = []
    for directory, _dirs, names in os.walk(path):
        out += [os.path.relpath(os.path.join(directory, n), path) for n in names]
    return sorted(out)
