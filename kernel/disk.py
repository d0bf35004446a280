"""A full disk, said plainly: what every writer of files (checkpoints, archive, weight versions) does
when the device under it has no space left.

The policy is stop, not retry: a writer that meets ENOSPC removes what it had half written (so that
no reader takes it and the space comes back), then raises `DiskFull` naming what it was writing and
where. Components let it end the process with that one line (exit 2); `undertow run`'s supervisor
records the line as the crash's cause and restarts with backoff, so a disk that gets space again is
picked up on a restart, and one that stays full fails the run after the restart budget. Retrying in
place would hide a full disk behind a stalled run.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager

FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(RuntimeError):
    """A write met a full device (ENOSPC) or quota (EDQUOT); what was half written is gone."""

    errno = errno.ENOSPC


def is_disk_full(error: BaseException) -> bool:
    """ENOSPC / EDQUOT anywhere in the exception's chain (torch and pyarrow wrap the OSError)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DiskFull) or (isinstance(current, OSError) and current.errno in FULL):
            return True
        # torch.save's writer reports ENOSPC as a RuntimeError text; pyarrow as an OSError text
        text = str(current)
        if "No space left on device" in text or "Disk quota exceeded" in text:
            return True
        current = current.__cause__ or current.__context__
    return False


@contextmanager
def stop_when_full(what: str, where: str, cleanup: Callable[[], None] | None = None) -> Iterator[None]:
    """Run a write; on a full disk call `cleanup` (remove the partial output), then raise DiskFull."""
    try:
        yield
    except Exception as e:
        if not is_disk_full(e):
            raise
        if cleanup is not None:
            try:
                cleanup()
            except OSError:
                pass  # the message below matters more than a leftover a restart's recovery removes
        raise DiskFull(f"{what}: no space left on the device under {where} ({e.__class__.__name__}: {e}); "
                       f"stopped cleanly, nothing half written kept: free space, then resume") from e


def remove(path: str | os.PathLike) -> Callable[[], None]:
    """A cleanup for `stop_when_full`: delete a file or a directory tree if it is there."""
    def cleanup() -> None:
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)
    return cleanup
