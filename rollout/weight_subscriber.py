"""A background thread on `<ns>.weights`: reassembles versions, refuses bad ones, hands good ones over.

The thread never touches the model. It leaves the newest verified version in a slot that the
worker empties between generations (`take()`), so weights change only between two generations.
"""

from __future__ import annotations

import logging
import threading

from schemas import WeightIntegrityError, WeightUpdate
from streams import KafkaSettings, RecordConsumer, RecordProducer, Topics

from rollout.weights import Assembled, WeightAssembler

log = logging.getLogger(__name__)


class WeightSubscriber(threading.Thread):
    """Reads the weights topic from its beginning (it keeps a day), so a new worker gets the latest."""

    def __init__(self, settings: KafkaSettings, topics: Topics, model: str, producer: RecordProducer):
        super().__init__(name="weight-subscriber", daemon=True)
        self.topics, self.producer = topics, producer
        self.assembler = WeightAssembler(model)
        self.consumer: RecordConsumer[WeightUpdate] = RecordConsumer(
            settings, [], group_id=None, expect=WeightUpdate, rejected_topic=topics.rejected,
            producer=producer, stage="weights")
        self.consumer.assign(topics.weights, "earliest")
        self._end = self.consumer.end_offsets()  # what was published before we started
        self.caught_up = threading.Event()
        self._lock = threading.Lock()
        self._ready: Assembled | None = None
        self._halt = threading.Event()
        self.latest_announced = 0  # version of the last chunk of our model (lower after a trainer resumed)
        self.refused: list[int] = []

    def run(self) -> None:
        try:
            while not self._halt.is_set():
                for delivery in self.consumer.poll(timeout_ms=200):
                    self._handle(delivery.record)
                if not self.caught_up.is_set() and self.consumer.reached(self._end):
                    self.caught_up.set()
        finally:
            self.consumer.close()

    def take(self) -> Assembled | None:
        """The newest verified version not taken yet, or None."""
        with self._lock:
            ready, self._ready = self._ready, None
            return ready

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def _handle(self, chunk: WeightUpdate) -> None:
        if chunk.model != self.assembler.model:
            return
        if chunk.version < self.latest_announced:
            log.warning("weights %s v%d after v%d: the trainer resumed from a checkpoint; following it back",
                        chunk.model, chunk.version, self.latest_announced)
        self.latest_announced = chunk.version
        try:
            assembled = self.assembler.add(chunk)
        except WeightIntegrityError as e:
            self._refuse(chunk, e)
            return
        if assembled is not None:
            with self._lock:
                self._ready = assembled
            log.info("weights %s v%d assembled (%d bytes)", chunk.model, chunk.version, len(assembled.blob))
            self._report_incomplete(assembled.version)

    def _report_incomplete(self, newer: int) -> None:
        """Versions whose chunks stopped coming (a trainer that died mid-publish) end in the rejected topic."""
        while self.assembler.incomplete:
            lost = self.assembler.incomplete.pop(0)
            detail = f"{lost.received} of {lost.num_chunks} chunks arrived before v{newer} was complete"
            log.warning("dropping weights %s v%d: %s", lost.model, lost.version, detail)
            self.producer.reject(self.topics.rejected, stage="weights", reason="incomplete", detail=detail,
                                 source_topic=self.topics.weights, record_id=f"{lost.model}@v{lost.version}")
        self.producer.flush()

    def _refuse(self, chunk: WeightUpdate, error: WeightIntegrityError) -> None:
        """Log it, tell the rejected topic, keep the current weights."""
        log.error("refusing weights %s v%d: %s", chunk.model, chunk.version, error)
        self.refused.append(chunk.version)
        self.producer.reject(self.topics.rejected, stage="weights", reason="checksum", detail=str(error),
                             source_topic=self.topics.weights, record_id=f"{chunk.model}@v{chunk.version}")
        self.producer.flush()
