"""Concurrent requests into one engine call: the engine's `generate` takes a batch, so N agents
asking at once cost about one generation, not N in a row.

One thread owns the engine. A request queues its prompt and waits; the thread takes the first one,
waits `window_s` for company (0: none), then takes every request already queued (those that came
while the engine was busy) up to `max_batch`, and answers each group of requests that sample alike
(same n and sampling, `max_new_tokens` included, so no answer is cut or lengthened by its
neighbours) with one `generate`. `before()` runs under the same thread before each call: the
endpoint loads new weights there, so a generation and a weight load never overlap. An engine with
`submit` (the asynchronous vLLM engine) batches on its own: each request goes in at once.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from undertow.rollout.engines import Engine, Sample, SamplingParams


@dataclass
class Answer:
    """One request's samples and the policy version of the weights that generated them."""

    samples: list[Sample]
    version: int


@dataclass
class _Request:
    prompt: list[int]
    n: int
    params: SamplingParams
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)


@dataclass
class BatchStats:
    """What the engine saw: calls, requests and rows (prompts times n) answered, and the largest call."""

    calls: int = 0
    requests: int = 0
    rows: int = 0
    largest: int = 0

    def occupancy(self, max_batch: int) -> float:
        """Mean requests per engine call over `max_batch` (1: every call full)."""
        return self.requests / (self.calls * max_batch) if self.calls else 0.0


class Batcher:
    """`generate(prompt, n, params)` from many threads; one engine call per batch of them."""

    def __init__(self, engine: Engine, *, before: Callable[[], int], window_s: float = 0.0, max_batch: int = 64):
        self.engine, self.before, self.window_s, self.max_batch = engine, before, window_s, max_batch
        self.stats = BatchStats()
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._submit_lock = threading.Lock()  # `before` and a submit are one step for an engine with submit
        self._thread: threading.Thread | None = None
        self._started = threading.Lock()
        self._closed = False

    def generate(self, prompt: list[int], n: int, params: SamplingParams) -> Answer:
        """The n samples of `prompt`, generated with whatever else is asked meanwhile (blocks)."""
        if hasattr(self.engine, "submit"):
            return self._submit(prompt, n, params)
        if self._closed:
            raise RuntimeError("the endpoint is shutting down")
        self._ensure_thread()
        request = _Request(prompt, n, params)
        self._queue.put(request)
        return request.future.result()

    def close(self) -> None:
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(timeout=30)

    def _submit(self, prompt: list[int], n: int, params: SamplingParams) -> Answer:
        with self._submit_lock:
            version = self.before()
            future = self.engine.submit(prompt, n, params)
            self._count([_Request(prompt, n, params)])
        samples = future.result()
        # An asynchronous engine may swap weights mid-answer: the oldest version that made a token counts.
        seen = [v for s in samples for v in s.versions]
        return Answer(samples, min(seen) if seen else version)

    def _ensure_thread(self) -> None:
        with self._started:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="serve-batcher", daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = self._gather(first)
            for group in _groups(batch):
                self._answer(group)
            if None in batch:
                return

    def _gather(self, first: _Request) -> list[_Request | None]:
        """`first`, whatever joins within the window, then whatever is queued, up to max_batch."""
        batch: list[_Request | None] = [first]
        deadline = time.monotonic() + self.window_s
        while len(batch) < self.max_batch and batch[-1] is not None:
            wait = deadline - time.monotonic()
            try:
                batch.append(self._queue.get(timeout=wait) if wait > 0 else self._queue.get_nowait())
            except queue.Empty:
                break
        return batch

    def _answer(self, group: list[_Request]) -> None:
        try:
            version = self.before()
            out = self.engine.generate([r.prompt for r in group], group[0].n, group[0].params)
        except BaseException as e:  # every waiter learns it (a 400 or 500 each), the thread goes on
            for r in group:
                r.future.set_exception(e)
            return
        self._count(group)
        for r, samples in zip(group, out):
            r.future.set_result(Answer(samples, version))

    def _count(self, group: list[_Request]) -> None:
        self.stats.calls += 1
        self.stats.requests += len(group)
        self.stats.rows += sum(r.n for r in group)
        self.stats.largest = max(self.stats.largest, len(group))


def _groups(batch: list[_Request | None]) -> list[list[_Request]]:
    """The batch's requests by (n, sampling), in arrival order of each group's first."""
    groups: dict[tuple[int, str], list[_Request]] = {}
    for r in batch:
        if r is not None:
            groups.setdefault((r.n, r.params.model_dump_json()), []).append(r)
    return list(groups.values())
