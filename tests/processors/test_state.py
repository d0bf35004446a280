"""State writes per batch: each put/delete on a changelogged store costs a Kafka record."""

from undertow.processors import Harness
from undertow.processors.groups import Arrival, GroupBuffer
from undertow.processors.state import DedupeWindow, MemoryStore, StageContext, content_hash
from tests.helpers import exp, group


class CountingStore(MemoryStore):
    """A MemoryStore that counts writes and spreads routes over `shards` shards."""

    def __init__(self, shards: int = 1):
        super().__init__()
        self.shards, self.puts, self.deletes = shards, 0, 0

    def put(self, key, value, route):
        self.puts += 1
        super().put(key, value, route)

    def delete(self, key, route):
        self.deletes += 1
        super().delete(key, route)

    def shard(self, route):
        return route[-1] % self.shards


def test_a_group_is_stored_once_per_batch_and_never_when_it_completes_within_one():
    store = CountingStore()
    buffer = GroupBuffer(store, timeout_s=60, max_open=100)
    for e in group("whole", [1.0, 0.0, 1.0, 0.0]) + group("half", [1.0, 0.0, 1.0, 0.0])[:3]:
        buffer.add(Arrival(e), now=0.0)
    buffer.flush()
    assert (store.puts, store.deletes, set(store.data)) == (1, 0, {b"half"})  # 3 samples, 1 write
    closed = buffer.add(Arrival(exp("half", 3, 4)), now=1.0)
    buffer.flush()
    assert [a.experience.sample_index for a in closed.members] == [0, 1, 2, 3]
    assert (store.puts, store.deletes, len(store)) == (1, 1, 0)


def test_a_restarted_buffer_resumes_a_stored_group():
    store = MemoryStore()
    first = GroupBuffer(store, timeout_s=60, max_open=100)
    for e in group("g", [1.0, 0.0, 1.0])[:2]:
        first.add(Arrival(e), now=0.0)
    first.flush()
    second = GroupBuffer(store, timeout_s=60, max_open=100)  # a new worker over the restored table
    closed = second.add(Arrival(exp("g", 2, 3)), now=1.0)
    assert [a.experience.experience_id for a in closed.members] == ["g/0", "g/1", "g/2"]


def test_dedupe_writes_one_bucket_per_shard_and_batch_and_a_new_window_restores_it():
    store = CountingStore(shards=2)
    window = DedupeWindow(store, window_s=10, max_entries=1000)
    keys = [content_hash(str(i)) for i in range(6)]
    assert [window.seen(k, bytes([i]), now=0.0) for i, k in enumerate(keys)] == [False] * 6
    assert window.seen(keys[0], b"\x00", now=1.0)
    window.flush()
    assert (store.puts, len(store)) == (2, 2)  # 6 hashes over 2 shards: 2 records, not 6
    restored = DedupeWindow(store, window_s=10, max_entries=1000)
    assert len(restored) == 6 and restored.seen(keys[5], b"\x05", now=2.0)
    assert not restored.seen(keys[5], b"\x05", now=10.5)  # both buckets left the window
    restored.flush()
    assert store.deletes == 2 and len(store) == 1 and len(restored) == 1


def test_dedupe_reads_entries_stored_one_hash_per_key():
    import msgpack

    store = MemoryStore()
    key = content_hash("old")
    store.put(key, msgpack.packb([0.0, b"g"]), b"g")
    assert DedupeWindow(store, window_s=10, max_entries=100).seen(key, b"g", now=1.0)


def test_a_batch_of_distinct_samples_costs_one_dedupe_write():
    h = Harness(["clean"])
    store = CountingStore()
    h.pipeline.stages[0].impl.bind(StageContext(store=lambda name: store, clock=lambda: h.now))
    h.feed([exp(f"s{i}", 0, 1, text=f"t{i}") for i in range(50)])
    h.feed([exp("s3", 0, 1, text="t3")])  # redelivered
    assert store.puts == 1 and len(h.ready) == 50 and h.reasons() == [("clean", "duplicate")]


def test_all_finite_tells_overflow_from_infinity():
    from undertow.processors.clean import all_finite

    assert all_finite([]) and all_finite([-0.5, 2.0])
    assert all_finite([1e308, 1e308])  # the sum overflows to inf, the values are finite
    assert not all_finite([1.0, float("nan")]) and not all_finite([float("inf"), float("-inf")])
