"""Hostile records on <ns>.experiences.raw, read by one long-lived `undertow process` Faust worker.

Every test sends a good group, its hostile records, and another good group; both good groups must
come out on experiences.ready and every hostile record must land in experiences.rejected with its
stage and reason, while the same worker keeps running for the next test.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

import pytest
from kafka.errors import MessageSizeTooLargeError

from undertow.schemas import MAX_RECORD_BYTES, Experience, Rejected, Task, encode
from undertow.schemas.base import MAX_TOKENS
from undertow.schemas.events import MAX_ORIGINAL_BYTES
from undertow.streams import KafkaSettings, RecordProducer, Topics
from undertow.streams.topics import MAX_MESSAGE_BYTES
from tests.hostile.helpers import TopicReader, f32, fields_of, fresh_namespace, pack, train_ids, trainer_intake
from tests.helpers import exp, group
from tests.processors.test_broker import start, stop

pytestmark = [pytest.mark.broker, pytest.mark.slow]

GROUP_TIMEOUT_S = 5.0
EXPLODE = "tests.processors.plugins.explode_on"
GROUP_BOOM = "tests.hostile.processor_plugins.GroupBoom"
PIPELINE = ["clean", {"name": EXPLODE, "text": "boom"}, {"name": "reshape", "advantage": "rloo"}, GROUP_BOOM,
            "prioritize"]

Payload = bytes | Experience | None  # None: a message with a null value (a tombstone)


@dataclass
class Outcome:
    rejected: list[Rejected]
    ready: list[str]  # experience ids on the ready topic, besides the good groups

    def reasons(self) -> dict[str, tuple[str, str]]:
        """original key (record id when known) -> (stage, reason)."""
        return {r.record_id or (r.original_key or b"").decode(): (r.stage, r.reason) for r in self.rejected}


@dataclass
class ProcessorUnderTest:
    """The running worker, and a ledger of what the tests sent it."""

    kafka: KafkaSettings
    topics: Topics
    proc: subprocess.Popen
    reader: TopicReader
    producer: RecordProducer
    prefixes: list[str] = field(default_factory=list)
    sent: int = 0  # messages sent to raw, good and hostile
    expect_ready: list[str] = field(default_factory=list)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def exchange(self, prefix: str, hostile: list[tuple[str, Payload]], rejected: int,
                 ready: tuple[str, ...] = (), timeout: float = 120.0, exact: bool = True) -> Outcome:
        """Send a good group, `hostile` (key, payload) in order, another good group; wait until both
        good groups and `ready` are on the ready topic and `rejected` records of `prefix` (all so
        far; exactly that many unless not `exact`) are dead-lettered."""
        self.prefixes.append(prefix)
        n = len(self.prefixes)  # a prefix may exchange twice: its good groups differ each time
        ok = group(f"{prefix}/ok-{n}a", [0.0, 1.0]), group(f"{prefix}/ok-{n}b", [1.0, 0.0])
        for e in ok[0]:
            self.producer.send(self.topics.raw, e, key=e.group_id)
        for key, payload in hostile:
            if isinstance(payload, Experience):
                self.producer.send(self.topics.raw, payload, key=key)
            else:
                self.producer.send_bytes(self.topics.raw, payload, key=key)
        for e in ok[1]:
            self.producer.send(self.topics.raw, e, key=e.group_id)
        self.producer.flush()
        self.sent += len(hostile) + 4
        want = {e.experience_id for g in ok for e in g} | set(ready)
        self.expect_ready += sorted(want - set(self.expect_ready))
        out = lambda: self.outcome(prefix)
        self.reader.wait(lambda: want <= set(out().ready) and len(out().rejected) >= rejected, timeout,
                         f"{prefix}: {sorted(want)} ready and {rejected} rejected", self.alive)
        result = out()
        got = [(r.record_id, r.stage, r.reason) for r in result.rejected]
        assert len(got) == rejected or not exact, got
        result.ready = [i for i in result.ready if "/ok-" not in i]
        return result

    def outcome(self, prefix: str) -> Outcome:
        ready = self.reader.keyed(self.topics.ready, prefix)
        assert all(m.error is None for m in ready), [str(m.error) for m in ready if m.error]
        return Outcome(self.reader.rejected(self.topics.rejected, prefix), [m.record.experience_id for m in ready])


@pytest.fixture(scope="module")
def worker(kafka, tmp_path_factory):
    namespace = fresh_namespace(kafka, "proc")
    topics = Topics(namespace)
    workdir = tmp_path_factory.mktemp("hostile-processors")
    proc = start(workdir, namespace, pipeline=PIPELINE, group_timeout_s=GROUP_TIMEOUT_S, on_timeout="reject")
    reader = TopicReader(kafka, [topics.ready, topics.rejected])
    # gzip: kafka-python checksums batches in pure Python (~2.5 MB/s), and a compressed batch of a
    # 20 MB repetitive record is small; the worker still sees the record's full size.
    producer = RecordProducer(kafka, compression_type="gzip")
    try:
        yield ProcessorUnderTest(kafka, topics, proc, reader, producer)
        assert proc.poll() is None, (workdir / "process-1.log").read_text()[-3000:]
    finally:
        producer.close()
        reader.close()
        stop(proc)


def sample(group_id: str, index: int = 0, size: int = 1, text: str | None = None) -> Experience:
    return exp(group_id, index, size, reward=float(index), text=text or f"answer {index}")


def test_undecodable_bytes(worker):
    p = "undecodable"
    payloads = {
        f"{p}/garbage": b"\xc1 not msgpack",
        f"{p}/empty": b"",
        f"{p}/null": None,
        f"{p}/array": pack([1, 2, 3]),
        f"{p}/no-kind": pack({"experience_id": "x"}),
        f"{p}/cut-short": encode(sample(f"{p}/cut"))[:-9],
        f"{p}/bad-utf8": b"\x81\xa4kind\xa2\xff\xfe",  # {"kind": <2 bytes that are not UTF-8>}
    }
    out = worker.exchange(p, list(payloads.items()), rejected=len(payloads))
    assert set(out.reasons().values()) == {("decode", "undecodable")}
    assert {r.original_key.decode(): r.original for r in out.rejected} == {k: v or b"" for k, v in payloads.items()}
    assert all(r.topic == worker.topics.raw and r.offset is not None for r in out.rejected)


def test_wrong_schema_version_and_kind(worker):
    p = "schema"
    versions = {"v99": 99, "v0": 0, "v-str": "1", "v-bool": True}
    hostile = [(f"{p}/{name}", pack({**fields_of(sample(f"{p}/{name}")), "schema_version": v}))
               for name, v in versions.items()]
    no_version = fields_of(sample(f"{p}/none"))
    del no_version["schema_version"]
    hostile += [(f"{p}/none", pack(no_version)),
                (f"{p}/kind", pack({**fields_of(sample(f"{p}/kind")), "kind": "experience_v2"})),
                (f"{p}/task", encode(Task(task_id=f"{p}/task", prompt="a task on the wrong topic")))]
    out = worker.exchange(p, hostile, rejected=len(hostile))
    reasons = out.reasons()
    assert reasons == {**{f"{p}/{n}/0": ("decode", "schema_version") for n in [*versions, "none"]},
                       f"{p}/v99/0": ("decode", "schema_too_new"),  # newer than this reader: older ones upgrade
                       f"{p}/kind": ("decode", "unknown_kind"), f"{p}/task": ("decode", "unexpected_kind")}
    details = {r.record_id: r.detail for r in out.rejected}
    assert details[f"{p}/v0/0"] == "schema_version: expected 1 to 2, got 0"  # experience v2: token_versions
    assert details[f"{p}/v99/0"].startswith("schema_version: experience v99 is newer than this reader's v2")
    assert "got True" in details[f"{p}/v-bool/0"]  # True == 1 in Python, but not on the wire


def test_missing_and_extra_fields(worker):
    p = "fields"
    edits = {"no-version": ("policy_version", None), "no-finish": ("finish_reason", None),
             "extra": ("surprise", 1), "wrong-type": ("group_size", "four"), "bad-index": ("sample_index", 5)}
    hostile = []
    for name, (key, value) in edits.items():
        fields = fields_of(sample(f"{p}/{name}", size=2))
        if value is None:
            del fields[key]
        else:
            fields[key] = value
        hostile.append((f"{p}/{name}", pack(fields)))
    no_id = fields_of(sample(f"{p}/no-id"))
    del no_id["experience_id"]
    hostile.append((f"{p}/no-id", pack(no_id)))
    out = worker.exchange(p, hostile, rejected=len(hostile))
    assert set(out.reasons().values()) == {("decode", "invalid")}
    detail = {r.original_key.decode(): r.detail for r in out.rejected}
    for name, (key, _) in edits.items():
        assert key in detail[f"{p}/{name}"], detail[f"{p}/{name}"]
    assert "experience_id" in detail[f"{p}/no-id"] and "sample_index: 5 >= group_size 2" in detail[f"{p}/bad-index"]


def test_token_and_logprob_length_mismatch(worker):
    p = "lengths"  # 3 response tokens each
    edits = {"logprobs": ("behaviour_logprobs", f32([-0.5] * 4)), "mask": ("loss_mask", bytes([1, 1])),
             "advantages": ("advantages", f32([0.1] * 5)), "odd-bytes": ("response_tokens", b"\x01" * 10),
             "not-packed": ("behaviour_logprobs", [-0.5, -0.5, -0.5])}
    hostile = [(f"{p}/{n}", pack({**fields_of(sample(f"{p}/{n}")), k: v})) for n, (k, v) in edits.items()]
    out = worker.exchange(p, hostile, rejected=len(hostile))
    assert set(out.reasons().values()) == {("decode", "invalid")}
    detail = {r.record_id: r.detail for r in out.rejected}
    assert detail[f"{p}/logprobs/0"] == "behaviour_logprobs: length 4 != response_tokens length 3"
    assert detail[f"{p}/mask/0"] == "loss_mask: length 2 != response_tokens length 3"
    assert detail[f"{p}/advantages/0"] == "advantages: length 5 != response_tokens length 3"
    assert "response_tokens: 10 bytes is not a multiple of 4" in detail[f"{p}/odd-bytes/0"]
    assert "behaviour_logprobs: expected packed" in detail[f"{p}/not-packed/0"]


def test_nan_and_infinite_rewards(worker):
    p = "nonfinite"
    nan, inf = float("nan"), float("inf")
    edits = {"nan": ("reward", nan), "inf": ("reward", inf), "-inf": ("reward", -inf),
             "component": ("reward_components", {"correct": nan}),
             "logprob": ("behaviour_logprobs", f32([nan, -1, -1])),
             "advantage": ("advantages", f32([inf, 0, 0])), "priority": ("priority", inf)}
    hostile = [(f"{p}/{n}", pack({**fields_of(sample(f"{p}/{n}")), k: v})) for n, (k, v) in edits.items()]
    out = worker.exchange(p, hostile, rejected=len(hostile))
    assert set(out.reasons().values()) == {("decode", "invalid")}
    detail = {r.record_id: r.detail for r in out.rejected}
    for name, (key, _) in edits.items():
        assert detail[f"{p}/{name}/0"].startswith(key), detail[f"{p}/{name}/0"]
        assert "finite" in detail[f"{p}/{name}/0"]


def test_records_over_the_size_limit(worker):
    p = "oversize"
    # Every field within its own bound, the whole record over MAX_RECORD_BYTES (3 bytes per "€").
    big = sample(f"{p}/texts").model_copy(update={"prompt_text": "€" * 2_000_000, "response_text": "€" * 4_000_000})
    big_bytes = encode(big)
    assert MAX_RECORD_BYTES < len(big_bytes) < MAX_MESSAGE_BYTES
    tokens = pack({**fields_of(sample(f"{p}/tokens")), "response_tokens": b"\x01\x00\x00\x00" * (MAX_TOKENS + 1)})
    out = worker.exchange(p, [(f"{p}/texts", big_bytes), (f"{p}/tokens", tokens)], rejected=2)
    by_key = {r.original_key.decode(): r for r in out.rejected}
    assert {k: (r.stage, r.reason) for k, r in by_key.items()} == {
        f"{p}/texts": ("decode", "too_large"), f"{p}/tokens": ("decode", "invalid")}
    texts = by_key[f"{p}/texts"]
    assert f"{len(big_bytes)} bytes > max_bytes {MAX_RECORD_BYTES}" in texts.detail
    assert texts.original == big_bytes[:MAX_ORIGINAL_BYTES] and "[original cut from" in texts.detail
    assert f"response_tokens: {MAX_TOKENS + 1} items > max {MAX_TOKENS}" in by_key[f"{p}/tokens"].detail
    # Past the Kafka message limit nothing reaches a topic: the producer refuses, saying why.
    with pytest.raises(MessageSizeTooLargeError, match="larger than the maximum request size"):
        worker.producer.send_bytes(worker.topics.raw, bytes(MAX_MESSAGE_BYTES + 1), key=f"{p}/huge")


def test_groups_that_never_complete(worker):
    p = "partial"
    lonely = [sample(f"{p}/lonely", i, size=3) for i in range(2)]  # 2 of 3 ever arrive
    mismatch = [sample(f"{p}/mismatch", 0, size=2), sample(f"{p}/mismatch", 1, size=3)]
    hostile = [(e.group_id, e) for e in lonely + mismatch]
    out = worker.exchange(p, hostile, rejected=4, timeout=120 + GROUP_TIMEOUT_S)
    assert out.reasons() == {f"{p}/lonely/0": ("assemble", "group_timeout"),
                             f"{p}/lonely/1": ("assemble", "group_timeout"),
                             f"{p}/mismatch/1": ("assemble", "group_mismatch"),
                             f"{p}/mismatch/0": ("assemble", "group_timeout")}
    detail = {r.record_id: r.detail for r in out.rejected}
    assert detail[f"{p}/lonely/0"] == "2 of 3 samples arrived before the timeout"
    assert detail[f"{p}/mismatch/1"] == "group_size 3 != 2 of earlier samples"


def test_replayed_experience_id(worker):
    p = "replay"
    same = [sample(f"{p}/same", 0, 2), sample(f"{p}/same", 0, 2), sample(f"{p}/same", 1, 2)]
    changed = [sample(f"{p}/changed", 0, 2), sample(f"{p}/changed", 0, 2, text="a second answer"),
               sample(f"{p}/changed", 1, 2)]
    ids = (f"{p}/same/0", f"{p}/same/1", f"{p}/changed/0", f"{p}/changed/1")
    out = worker.exchange(p, [(e.group_id, e) for e in same + changed], rejected=2, ready=ids)
    assert out.reasons() == {f"{p}/same/0": ("clean", "duplicate"), f"{p}/changed/0": ("assemble", "duplicate_sample")}
    # Replayed after their group left: the same bytes are still a duplicate. The same id with new
    # content is no redelivery to the processors and may reach ready again: the trainer's
    # idempotence stops it (test_the_trainer_learns_each_id_at_most_once).
    late = [same[0], sample(f"{p}/same", 1, 2, text="regenerated")]
    out = worker.exchange(p, [(e.group_id, e) for e in late], rejected=3, ready=ids, exact=False)
    assert [(r.record_id, r.stage, r.reason) for r in out.rejected].count((f"{p}/same/0", "clean", "duplicate")) == 2
    regenerated = lambda: worker.outcome(p).ready.count(f"{p}/same/1") == 2 or len(worker.outcome(p).rejected) == 4
    worker.reader.wait(regenerated, 60 + GROUP_TIMEOUT_S, "the regenerated sample", worker.alive)
    if worker.outcome(p).ready.count(f"{p}/same/1") == 2:
        worker.expect_ready.append(f"{p}/same/1")


def test_processor_plugin_that_raises(worker):
    p = "plugin"
    record_bug = [sample(f"{p}/record", 0, 2, text="boom"), sample(f"{p}/record", 1, 2)]
    group_bug = [sample(f"{p}/group", 0, 2, text="group-boom"), sample(f"{p}/group", 1, 2)]
    out = worker.exchange(p, [(e.group_id, e) for e in record_bug + group_bug], rejected=3, ready=(f"{p}/record/1",))
    assert out.reasons() == {f"{p}/record/0": (EXPLODE, "error"), f"{p}/group/0": (GROUP_BOOM, "error"),
                             f"{p}/group/1": (GROUP_BOOM, "error")}
    detail = {r.record_id: r.detail for r in out.rejected}
    assert detail[f"{p}/record/0"] == "ValueError: cannot handle this one"
    assert detail[f"{p}/group/0"] == "KeyError: 'a group plugin bug'"


def test_rewards_that_overflow_the_advantages(worker):
    """Finite rewards whose advantages leave the float32 range of the wire format are refused."""
    p = "overflow"
    pair = [exp(f"{p}/g", i, 2, reward=r, text=f"a{i}") for i, r in enumerate([1e39, 0.0])]
    for e in pair:
        worker.producer.send(worker.topics.raw, e, key=e.group_id)
    worker.producer.flush()
    reader, topics = worker.reader, worker.topics
    reader.wait(lambda: reader.keyed(topics.ready, p) or len(reader.rejected(topics.rejected, p)) == 2, what=p,
                alive=worker.alive)
    assert not reader.keyed(topics.ready, p)
    assert {(r.stage, r.reason) for r in reader.rejected(topics.rejected, p)} == {("reshape", "non_finite")}


def test_the_trainer_learns_each_id_at_most_once(worker):
    """The trainer's intake over everything the processors let through: replays included, each id once."""
    worker.exchange("trained-once", [], rejected=0)  # something to train on, were this test run alone
    feed = trainer_intake(worker.kafka, worker.topics, worker.producer, checks_staleness=False)
    try:
        trained = train_ids(feed)
    finally:
        feed.close()
    assert len(trained) >= 4 and len(trained) == len(set(trained))
    worker.reader.poll()
    on_ready = {m.record.experience_id for m in worker.reader.messages[worker.topics.ready] if m.record is not None}
    assert set(trained) == on_ready


def test_nothing_else_was_lost_and_the_worker_still_runs(worker):
    """Across the tests above: every message sent is on ready exactly once, or dead-lettered."""
    worker.exchange("last", [("last/junk", b"\xc1 not msgpack")], rejected=1)  # were this test run alone
    reader, topics, prefixes = worker.reader, worker.topics, tuple(worker.prefixes)
    reader.poll()
    ready = [m.record.experience_id for m in reader.messages[topics.ready] if m.key.startswith(prefixes)]
    rejected = [r for r in reader.rejected(topics.rejected, "")
                if (r.original_key or b"").decode().startswith(prefixes)]
    assert sorted(ready) == sorted(worker.expect_ready)  # none lost; each once (a regenerated replay may pass twice)
    assert len(ready) + len(rejected) == worker.sent
    assert worker.alive()
