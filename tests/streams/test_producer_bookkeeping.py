"""RecordProducer's bookkeeping of unacknowledged sends, on a stand-in for kafka-python's producer
(no broker: what is tested is which futures are kept and how often they are looked at)."""

from __future__ import annotations

import pytest

from undertow.streams import producer as producer_module
from undertow.streams import DeliveryError, KafkaSettings, RecordProducer


class Future:
    reads = 0  # how often any future's state was looked at

    def __init__(self, done: bool, ok: bool = True):
        self._done, self._ok = done, ok
        self.exception = None if ok else RuntimeError("refused")

    @property
    def is_done(self) -> bool:
        Future.reads += 1
        return self._done

    def succeeded(self) -> bool:
        return self._ok

    def failed(self) -> bool:
        return not self._ok


class Kafka:
    """What RecordProducer calls on kafka-python's KafkaProducer; every future in the state `next` says."""

    def __init__(self):
        self.next = dict(done=False)

    def send(self, topic, value, key, partition):
        return Future(**self.next)

    def flush(self, timeout=None):
        pass


@pytest.fixture
def producer(monkeypatch):
    monkeypatch.setattr(producer_module, "connect", lambda cls, settings, **kw: Kafka())
    Future.reads = 0
    return RecordProducer(KafkaSettings(bootstrap_servers="unused:9092"))


def test_a_burst_of_sends_ahead_of_the_acknowledgements_costs_constant_work_per_send(producer):
    n = 60_000  # a replay: every record sent before the first acknowledgement comes back
    for _ in range(n):
        producer.send_bytes("t", b"x")
    assert len(producer._unflushed) == n  # none acknowledged: none may be dropped
    assert Future.reads <= 2 * n, f"{Future.reads} looks at {n} pending futures: a scan per send"


def test_acknowledged_sends_are_dropped_and_refused_ones_raise_at_flush(producer):
    producer._producer.next = dict(done=True)
    for _ in range(25_000):
        producer.send_bytes("t", b"x")
    assert len(producer._unflushed) <= RecordProducer._PRUNE_EVERY  # bounded without a flush
    producer._producer.next = dict(done=True, ok=False)
    producer.send_bytes("t", b"refused")
    producer._producer.next = dict(done=True)
    for _ in range(20_000):
        producer.send_bytes("t", b"x")  # prunes pass by: the refused one is kept for flush()
    with pytest.raises(DeliveryError, match="1 record"):
        producer.flush()
