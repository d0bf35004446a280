"""A deadline on a processor's call: a plugin or data-juicer op that hangs must not stop the stream.

A stage's call runs on a helper thread and is waited for at most `timeout_s`; no result by then
raises StageTimeout, and the pipeline dead-letters the records with reason `timeout` (the pattern of
the rollout's reward deadline, rollout/rewards/registry.py). Without it a hung call blocked the worker
until its watchdog restarted it, and the restarted worker read the same record and hung again, for
good. Python cannot stop a thread: the hung call keeps its (daemon) thread and a new helper takes
the next calls. Past `max_hung` of them the pipeline says it is `wedged`, and the worker exits to be
restarted fresh once the records that hung are dead-lettered and committed (streams/faust/worker.py).

One helper thread at a time, reused across calls: a thread per call would cost a start per stage and
batch. A stage that runs only undertow's own code, or whose call keeps a deadline of its own (a model
scorer), says `bounded = True` and is called directly.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import Future, TimeoutError as FutureTimeout
from typing import Any, Callable

TIMEOUT = "timeout"  # the rejected record's reason


def built_in(*objs: Any) -> bool:
    """Whether every function or object of `objs` is undertow's own code (a user's may hang)."""
    def module(obj: Any) -> str:
        obj = getattr(obj, "func", obj)  # a functools.partial: a registry's bound function
        return getattr(obj, "__module__", None) or type(obj).__module__
    return all(module(obj).startswith("undertow.") for obj in objs)


class StageTimeout(RuntimeError):
    """A stage's call gave no result within its deadline."""


class Deadline:
    """Calls `fn(*args)` on a helper thread and waits at most `timeout_s` (None: call directly)."""

    def __init__(self, timeout_s: float | None, *, max_hung: int = 8):
        self.timeout_s, self.max_hung = timeout_s, max_hung
        self.hung: list[str] = []  # what each abandoned helper was running, oldest first
        self._helper: _Helper | None = None

    def call(self, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(*args)`, or StageTimeout naming `what` when it takes longer than the deadline."""
        if self.timeout_s is None:
            return fn(*args)
        if self._helper is None:
            self._helper = _Helper()
        future = self._helper.submit(fn, args)
        try:
            return future.result(self.timeout_s)
        except FutureTimeout:
            self._helper.abandon()  # it is stuck in `fn`: it exits once (if ever) `fn` returns
            self._helper = None
            self.hung.append(what)
            raise StageTimeout(f"{what}: no result within {self.timeout_s:g} s") from None

    def wedged(self) -> str | None:
        """Why this process should be restarted (too many calls still hang), else None."""
        if len(self.hung) < self.max_hung:
            return None
        return f"{len(self.hung)} processor calls hang past their {self.timeout_s:g} s deadline (last: {self.hung[-1]})"


class _Helper:
    """One daemon thread running submitted calls in order."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[..., Any], tuple, Future] | None] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="processor-call", daemon=True).start()

    def submit(self, fn: Callable[..., Any], args: tuple) -> Future:
        future: Future = Future()
        self._jobs.put((fn, args, future))
        return future

    def abandon(self) -> None:
        self._jobs.put(None)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args, future = job
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # handed to the caller's thread
                future.set_exception(e)
