"""Liveness for a processor worker: exit when it stops making progress, so its supervisor restarts it.

A Faust worker can wedge without crashing: a batch whose sends never complete, or a start-up that
never finishes (both seen under load on a fresh broker, inside aiokafka's metadata wait). Nothing
inside the worker times that out, and its partitions stay assigned to it, so the whole loop stops.
The watchdog is a thread, not a Faust timer, so it fires even if the event loop itself is blocked.
On a stall it prints where every coroutine waits and exits with STALLED; the restarted worker
resumes from its committed offsets and the dedupe state drops what the stalled one had sent.
"""

from __future__ import annotations

import asyncio
import faulthandler
import os
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterable, Iterator, NoReturn

STALLED = 75  # EX_TEMPFAIL: try again


class Watchdog:
    """Exits the process when work started more than `stall_s` seconds ago has not finished.

    Start-up counts as work until `ready()`; each `with watchdog.busy("what"):` block counts while
    it runs. An idle worker waiting for records is never killed.
    """

    def __init__(self, stall_s: float):
        self.stall_s = stall_s
        self._work: dict[object, tuple[float, str]] = {"start-up": (time.monotonic(), "start-up")}
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> "Watchdog":
        threading.Thread(target=self._watch, name="watchdog", daemon=True).start()
        return self

    def ready(self) -> None:
        """Start-up finished; remember the loop whose tasks a stall report prints."""
        self._loop = asyncio.get_running_loop()
        self._work.pop("start-up", None)

    @contextmanager
    def busy(self, what: str) -> Iterator[None]:
        token = object()
        self._work[token] = (time.monotonic(), what)
        try:
            yield
        finally:
            self._work.pop(token, None)

    def fail(self, why: str) -> NoReturn:
        """Report a stall (`why`) and exit to be restarted."""
        try:
            self._report(why)
        finally:
            os._exit(STALLED)

    def oldest(self) -> tuple[float, str]:
        """Seconds the oldest unfinished work has run, and what it is (0 when idle)."""
        work = list(self._work.values())
        if not work:
            return 0.0, ""
        since, what = min(work)
        return time.monotonic() - since, what

    def _watch(self) -> None:
        while True:
            time.sleep(min(1.0, self.stall_s / 4))
            age, what = self.oldest()
            if age > self.stall_s:
                self.fail(f"{what} unfinished after {age:.0f} s")

    def _report(self, why: str) -> None:
        print_where_it_waits(f"processor worker stalled: {why}; exiting with code {STALLED} to be restarted",
                             [self._loop] if self._loop is not None else [])


def print_where_it_waits(why: str, loops: Iterable[asyncio.AbstractEventLoop]) -> None:
    """Print `why`, every thread's stack and where each task of `loops` waits, on the process's stderr."""
    err = sys.__stderr__  # Faust replaces sys.stderr with a logger, which has no file descriptor
    print(f"=== undertow: {why} ===", file=err, flush=True)
    faulthandler.dump_traceback(file=err)
    for loop in loops:
        for task in list(asyncio.all_tasks(loop)):
            task.print_stack(limit=8, file=err)
    err.flush()
