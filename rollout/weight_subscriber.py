"""A background thread on `<ns>.weights`: brings versions in, refuses bad ones, hands good ones over.

Each update goes to the receiver of the transport it names (streams/weights/: inline chunks are
reassembled, files fetched, a broadcast received, each verified). All of it happens here, while the
worker generates: the thread never touches the model. It leaves the newest verified version in a
slot that the worker empties between generations (`take()`), so weights change only between two
generations and generation pauses only for the load itself.
"""

from __future__ import annotations

import logging
import threading
import time

from undertow.kernel.models import TokenizerMismatch
from undertow.schemas import WeightIntegrityError, WeightUpdate
from undertow.streams import KafkaSettings, RecordConsumer, RecordProducer, Topics
from undertow.streams.weights import Ready, Receiver, Receiving, check_announcement, transports

log = logging.getLogger(__name__)


def newest_announcements(updates: list[WeightUpdate]) -> list[WeightUpdate]:
    """`updates` without the announcements (no inline data) that a later one of the same model
    supersedes: fetching them would be wasted (or fail, once the trainer collected their files).
    Inline chunks all stay: a version is made of them."""
    last = {u.model: i for i, u in enumerate(updates) if u.data is None}
    return [u for i, u in enumerate(updates) if u.data is not None or last[u.model] == i]


def resumed_from(updates: list[WeightUpdate], model: str, before: int) -> int | None:
    """The version a trainer of `model` last resumed from in `updates` (an announcement lower than the
    one before it; `before`: the last one seen earlier), None if it did not resume. Read over every
    record, not only the newest announcement: a trainer that replays its checkpoint's steps can be
    back above where it was within one poll."""
    resumed = None
    for update in updates:
        if update.model == model:
            if update.version < before:
                resumed = update.version
            before = update.version
    return resumed


class WeightSubscriber(threading.Thread):
    """Reads the weights topic from its beginning (compacted: the newest announcement per model), so a
    new worker gets the latest. `join_broadcast: False` (side consumers such as the evaluator) waits
    for the files of a broadcast version instead of joining the trainer's group. `tokenizer`: the
    fingerprint of the engine's tokenizer; a version announced with another is refused, and
    `check()` raises from then on."""

    def __init__(self, settings: KafkaSettings, topics: Topics, model: str, producer: RecordProducer, *,
                 join_broadcast: bool = True, staging_dir: str | None = None, broadcast_timeout_s: float = 60.0,
                 tokenizer: str | None = None):
        super().__init__(name="weight-subscriber", daemon=True)
        self.topics, self.producer, self.model = topics, producer, model
        self.consumer: RecordConsumer[WeightUpdate] = RecordConsumer(
            settings, [], group_id=None, expect=WeightUpdate, rejected_topic=topics.rejected,
            producer=producer, stage="weights")
        self.consumer.assign(topics.weights, "earliest")
        self._end = self.consumer.end_offsets()  # what was published before we started
        self.caught_up = threading.Event()
        self._lock = threading.Lock()
        self._settling: list[tuple[threading.Event, dict]] = []  # settle()'s callers, with the end to reach
        self._ready: Ready | None = None
        self.receiving = Receiving(model, staging_dir, self.caught_up, join_broadcast, broadcast_timeout_s)
        self.receivers: dict[str, Receiver] = {}  # by transport, built at its first update: some keep state
        self.held = -1  # the newest version brought in, by any transport
        self._halt = threading.Event()
        self.latest_announced = 0  # version of the last record of our model (lower after a trainer resumed)
        self._resumed: int | None = None  # the version a trainer last resumed from, until `announced()` reads it
        self.refused: list[int] = []
        self.tokenizer = tokenizer
        self.mismatch: TokenizerMismatch | None = None

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                updates = [d.record for d in self.consumer.poll(timeout_ms=200)]
                self._note_announced(updates)
                for update in newest_announcements(updates):
                    self._handle(update)
                if not self.caught_up.is_set() and self.consumer.reached(self._end):
                    self.caught_up.set()
                self._answer_settling()
        finally:
            self.consumer.close()

    def settle(self, timeout: float) -> bool:
        """Wait until every announcement on the topic when called has been read and brought in (its
        version is `take()`-able): a stopping evaluator scores the last version the trainer published
        before the stop, not the one its thread had happened to read by then. False after `timeout`."""
        settled = threading.Event()
        with self._lock:
            self._settling.append((settled, {}))
        return settled.wait(timeout)

    def _answer_settling(self) -> None:
        if not self._settling:  # the poll loop's usual case: nobody is waiting
            return
        with self._lock:
            waiting = list(self._settling)
        for settled, end in waiting:
            if not end:  # the consumer is this thread's alone: the end is read here, after the call
                end.update(self.consumer.end_offsets())
            if self.consumer.reached(end):
                settled.set()
                with self._lock:
                    self._settling.remove((settled, end))

    def announced(self) -> tuple[int | None, int]:
        """(the version a trainer resumed from since the last call, or None; the latest announced)."""
        with self._lock:
            resumed, self._resumed = self._resumed, None
            return resumed, self.latest_announced

    def _note_announced(self, updates: list[WeightUpdate]) -> None:
        """What the trainer announced, before any of it is brought in (that may take a while)."""
        versions = [u.version for u in updates if u.model == self.model]
        if not versions:
            return
        resumed = resumed_from(updates, self.model, self.latest_announced)
        if resumed is not None and not self.caught_up.is_set():  # history: counting starts where we joined
            resumed = None
        if resumed is not None:
            log.warning("weights %s v%d after v%d: the trainer resumed from a checkpoint; following it back",
                        self.model, resumed, self.latest_announced)
        with self._lock:
            self._resumed = self._resumed if resumed is None else resumed
            self.latest_announced = versions[-1]

    def check(self) -> None:
        """Raise TokenizerMismatch once the trainer announced weights for a tokenizer not the engine's:
        experiences generated with it would train on ids the trainer reads otherwise."""
        if self.mismatch is not None:
            raise self.mismatch

    def take(self) -> Ready | None:
        """The newest verified version not taken yet, or None."""
        with self._lock:
            ready, self._ready = self._ready, None
            return ready

    def swap_in(self, engine: object, held: int | None) -> tuple[int, float] | None:
        """Between generations: the newest verified version into `engine` unless it is the version
        `held` already; (version, seconds generation paused), or None: nothing new, the same version,
        or refused (the rejected topic says why, the engine keeps its weights)."""
        self.check()
        ready = self.take()
        if ready is None:
            return None
        if ready.version == held:
            ready.discard()
            return None
        paused = self.load(ready, engine)
        return None if paused is None else (ready.version, paused)

    def load(self, ready: Ready, engine: object) -> float | None:
        """Load `ready` into `engine` (the caller's thread, between generations): the seconds it took,
        or None when the engine refused it (names or shapes not the model's; its weights unchanged):
        then the rejected topic says why."""
        started = time.perf_counter()
        at_version = getattr(engine, "at_version", None)  # an engine swapping in flight labels tokens inside the pause
        try:
            ready.load_into(engine if at_version is None else at_version(ready.version))
        except (ValueError, OSError) as e:  # not the model's tensors; staged files gone
            log.error("engine refused weights %s v%d: %s", ready.model, ready.version, e)
            self.refused.append(ready.version)
            self.producer.reject(self.topics.rejected, stage="weights", reason="mismatch", detail=str(e),
                                 source_topic=self.topics.weights, record_id=f"{ready.model}@v{ready.version}")
            self.producer.flush()
            return None
        finally:
            ready.discard()
        return time.perf_counter() - started

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)
        leftover = self.take()
        if leftover is not None:  # staged and never loaded: its files go
            leftover.discard()

    def _handle(self, update: WeightUpdate) -> None:
        if update.model != self.model:
            return
        if update.tokenizer and self.tokenizer and update.tokenizer != self.tokenizer:
            self.mismatch = TokenizerMismatch(
                f"the trainer's tokenizer of {update.model} (fingerprint {update.tokenizer}, weights v{update.version}) "
                f"is not this engine's ({self.tokenizer}): check that both environments load the same model "
                f"directory (kernel/models/tokenizer.py)")
            self._refuse(update, WeightIntegrityError(str(self.mismatch), "tokenizer_mismatch"))
            return
        try:
            ready = self._bring(update)
        except WeightIntegrityError as e:
            self._refuse(update, e)
            return
        except Exception as e:  # never lose the thread (the worker would wait for weights for ever)
            log.exception("weights %s v%d could not be brought in", update.model, update.version)
            self._refuse(update, WeightIntegrityError(f"{type(e).__name__}: {e}", "error"))
            return
        if ready is not None:
            self._offer(ready)
            log.info("weights %s v%d ready (%s)", update.model, update.version, update.transport)
            self._report_incomplete()

    def _bring(self, update: WeightUpdate) -> Ready | None:
        """The version `update` completes, verified; None while it is not complete (or already held)."""
        if update.version == self.held:  # redelivered, or the files after its broadcast
            return None
        if update.transport not in transports.names():  # never imported by a name a record gives
            raise WeightIntegrityError(f"{update.model} v{update.version}: transport {update.transport!r} is not "
                                       f"registered here (known: {transports.names()})", "invalid")
        transport = transports.get(update.transport)
        check_announcement(update, transport, update.transport)
        receiver = self.receivers.get(update.transport)
        if receiver is None:
            receiver = self.receivers[update.transport] = transport.receiver(self.receiving)
        ready = receiver.receive(update)
        if ready is not None:
            self.held = ready.version
        return ready

    def _offer(self, ready: Ready) -> None:
        with self._lock:
            if self._ready is not None:  # superseded before the worker took it
                self._ready.discard()
            self._ready = ready

    def _report_incomplete(self) -> None:
        """Versions a receiver gave up on (chunks that stopped coming: a trainer that died mid-publish)
        end in the rejected topic. Not while catching up: compaction leaves stray chunks of old
        versions, and live readers reported the real losses when they happened."""
        for receiver in self.receivers.values():
            for lost in receiver.lost():
                if not self.caught_up.is_set():
                    continue
                log.warning("dropping weights %s v%d: %s", lost.model, lost.version, lost.detail)
                self.producer.reject(self.topics.rejected, stage="weights", reason=lost.reason, detail=lost.detail,
                                     source_topic=self.topics.weights, record_id=f"{lost.model}@v{lost.version}")
        self.producer.flush()

    def _refuse(self, update: WeightUpdate, error: WeightIntegrityError) -> None:
        """Log it, tell the rejected topic, keep the current weights."""
        log.error("refusing weights %s v%d: %s", update.model, update.version, error)
        self.refused.append(update.version)
        self.producer.reject(self.topics.rejected, stage="weights", reason=error.reason, detail=str(error),
                             source_topic=self.topics.weights, record_id=f"{update.model}@v{update.version}")
        self.producer.flush()
