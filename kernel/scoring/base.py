"""What every model scorer shares: the items it scores, its verdicts, a content-hash cache, and calls
made on worker threads with a deadline.

A scorer takes a list of `Item`s (prompt, response, reference answer) and returns one `Scored` per
item: a value, or no value and the reason (`timeout`, `unparsable`, `error`). Both stages wrap the
same scorer classes: the processors as a `score` stage scorer (processors/scorers.py), the rollout
as a reward (rollout/rewards/models.py).
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

TIMEOUT, UNPARSABLE, ERROR = "timeout", "unparsable", "error"  # why a Scored has no value


@dataclass(frozen=True, slots=True)
class Item:
    """One response to score: the prompt it answers, the response, and the reference answer ("" if none)."""

    prompt: str
    response: str
    reference: str = ""


@dataclass(frozen=True, slots=True)
class Scored:
    """A verdict: `value`, or None with `reason` (TIMEOUT, UNPARSABLE, ERROR) and a `detail`."""

    value: float | None
    reason: str = ""
    detail: str = ""


def fingerprint(*parts: Any) -> str:
    """A short stable hex digest of `parts` (12 hex digits: a version, not a security check)."""
    h = hashlib.blake2b(digest_size=6)
    for part in parts:
        h.update(repr(part).encode())
        h.update(b"\x00")
    return h.hexdigest()


def dir_fingerprint(path: str | Path, head_bytes: int = 1 << 20) -> str:
    """A fingerprint of a model directory: every file's name and size, small files whole, large ones by
    their first and last `head_bytes` (hashing whole weights would cost seconds per GB at start-up;
    retrained weights change their header and tail too)."""
    root = Path(path)
    h = hashlib.blake2b(digest_size=6)
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        size = f.stat().st_size
        h.update(f"{f.relative_to(root)}\x00{size}\x00".encode())
        with f.open("rb") as fh:
            h.update(fh.read(head_bytes))
            if size > 2 * head_bytes:
                fh.seek(size - head_bytes)
                h.update(fh.read(head_bytes))
    return h.hexdigest()


def fill(template: str, item: Item) -> str:
    """`template` with {prompt}, {response}, {reference} replaced (other braces are left alone)."""
    return (template.replace("{prompt}", item.prompt).replace("{response}", item.response)
            .replace("{reference}", item.reference))


def existing_dir(field: str, path: str | Path | None) -> Path:
    """`path` as a Path, or a ValueError naming `field` when it is not a directory."""
    if path is None or not Path(path).is_dir():
        raise ValueError(f"{field}: {path!r} is not a directory")
    return Path(path)


class LRU:
    """A bounded least-recently-used map from content hash to verdict (only values are cached: a
    timeout or an unparsable answer is tried again next time)."""

    def __init__(self, size: int):
        self.size, self.data = size, OrderedDict[bytes, float]()
        self.hits = self.misses = 0

    def get(self, key: bytes) -> float | None:
        value = self.data.get(key)
        if value is None:
            self.misses += 1
            return None
        self.hits += 1
        self.data.move_to_end(key)
        return value

    def put(self, key: bytes, value: float) -> None:
        self.data[key] = value
        self.data.move_to_end(key)
        while len(self.data) > self.size:
            self.data.popitem(last=False)


class DaemonPool:
    """`workers` daemon threads running submitted calls. Daemon, unlike ThreadPoolExecutor's: a call
    that never returns (a hung endpoint) must not keep the process from exiting; it times out instead."""

    def __init__(self, workers: int, name: str):
        self.calls: queue.SimpleQueue[tuple[Future, Callable[[], Any]]] = queue.SimpleQueue()
        for i in range(workers):
            threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True).start()

    def submit(self, fn: Callable[[], Any]) -> Future:
        future: Future = Future()
        self.calls.put((future, fn))
        return future

    def _work(self) -> None:
        while True:
            future, fn = self.calls.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as e:  # noqa: BLE001 — the caller sees it
                future.set_exception(e)


class ModelScorer:
    """Base of the model scorers: `score(items)` looks each item up in the cache, sends the rest in
    chunks of `batch_size` to worker threads, and waits at most `timeout_s` for all of them.

    A subclass sets `name`, implements `load()` (called once, before the first batch, outside the
    deadline: loading a model is not scoring it), `_version()` and `_score_batch(items)`.
    """

    name: str

    def __init__(self, *, name: str, batch_size: int, timeout_s: float, cache_size: int, workers: int):
        if batch_size < 1 or workers < 1 or cache_size < 0 or timeout_s <= 0:
            raise ValueError("batch_size and workers must be >= 1, cache_size >= 0, timeout_s > 0")
        self.name, self.batch_size, self.timeout_s, self.workers = name, batch_size, timeout_s, workers
        self.cache = LRU(cache_size)
        self._pool: DaemonPool | None = None
        self._lock = threading.Lock()
        self._loaded = False
        self._version_str: str | None = None

    @property
    def version(self) -> str:
        """A fingerprint of what decides the scores (model files or endpoint and model, prompt, verdict)."""
        if self._version_str is None:
            self._version_str = self._version()
        return self._version_str

    @property
    def scored_by(self) -> str:
        """`name@version`: what an experience records as the origin of its score."""
        return f"{self.name}@{self.version}"

    def score(self, items: list[Item]) -> list[Scored]:
        """One verdict per item, in order; those not back within `timeout_s` get reason TIMEOUT."""
        self._ensure_loaded()
        keys = [_key(self.version, item) for item in items]
        out: list[Scored | None] = []
        for key in keys:
            cached = self.cache.get(key) if self.cache.size else None
            out.append(None if cached is None else Scored(cached))
        todo = [i for i, s in enumerate(out) if s is None]
        chunks = [todo[s:s + self.batch_size] for s in range(0, len(todo), self.batch_size)]
        futures = [self._pool.submit(lambda c=c: self._score_batch([items[i] for i in c])) for c in chunks]
        deadline = time.monotonic() + self.timeout_s
        for chunk, future in zip(chunks, futures):
            for i, verdict in zip(chunk, self._wait(future, len(chunk), deadline)):
                out[i] = verdict
                if verdict.value is not None and self.cache.size:
                    self.cache.put(keys[i], verdict.value)
        return out  # type: ignore[return-value]

    def _wait(self, future: Future, n: int, deadline: float) -> list[Scored]:
        try:
            verdicts = future.result(timeout=max(0.0, deadline - time.monotonic()))
        except (FutureTimeout, TimeoutError):  # our deadline, or the backend's own clock (an HTTP timeout) first
            future.cancel()  # still queued: never starts; already running: its result is dropped
            return [Scored(None, TIMEOUT, f"{self.name}: no verdict within {self.timeout_s:g} s")] * n
        except Exception as e:  # noqa: BLE001 — a backend failure fails these items, not the caller
            return [Scored(None, ERROR, f"{self.name}: {type(e).__name__}: {e}")] * n
        if len(verdicts) != n:
            return [Scored(None, ERROR, f"{self.name}: {len(verdicts)} verdicts for {n} items")] * n
        return list(verdicts)

    def _ensure_loaded(self) -> None:
        with self._lock:
            if not self._loaded:
                self.load()
                self._pool = DaemonPool(self.workers, self.name)
                self._loaded = True

    def load(self) -> None:
        """Load the model or open the client (once, on first use)."""

    def _version(self) -> str:
        raise NotImplementedError

    def _score_batch(self, items: list[Item]) -> list[Scored]:
        raise NotImplementedError


def _key(version: str, item: Item) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in (version, item.prompt, item.response, item.reference):
        h.update(part.encode("utf-8", "surrogatepass"))
        h.update(b"\x00")
    return h.digest()
