"""Hostile records on <ns>.experiences.ready, read by the trainer's own intake (trainer/ready_intake.py).

The feed is driven as rank 0 drives it (fill, next batch, trained_on, commit) without the model:
what matters here is which records reach a batch, and that the rest are dead-lettered.
"""

from __future__ import annotations

import pytest

from undertow.schemas import MAX_RECORD_BYTES, Experience, Rejected, Task, encode
from undertow.streams import RecordProducer, Topics
from tests.hostile.helpers import TopicReader, f32, fields_of, fresh_namespace, pack, train_ids, trainer_intake
from tests.helpers import exp

pytestmark = [pytest.mark.broker, pytest.mark.slow]

VERSION, MAX_STALENESS = 5, 2  # the trainer is at step 5 and accepts policy versions 3..5


def ready_group(group_id: str, size: int = 2, version: int = VERSION, **kw) -> list[Experience]:
    """What the processors emit: behaviour log-probs and advantages filled in."""
    fields = {"behaviour_logprobs": [-0.5] * 3, "advantages": [1.0] * 3, **kw}
    return [exp(group_id, i, size, reward=float(i), version=version, **fields) for i in range(size)]


@pytest.fixture
def ready(kafka, request):
    """A fresh namespace and a gzip producer (compressed, a 17 MB record costs kafka-python little)."""
    topics = Topics(fresh_namespace(kafka, request.node.name[5:20].replace("_", "-")))
    with RecordProducer(kafka, compression_type="gzip") as producer:
        yield topics, producer


def send(producer: RecordProducer, topic: str, items: list[tuple[str, bytes | Experience]]) -> None:
    for key, payload in items:
        if isinstance(payload, Experience):
            producer.send(topic, payload, key=key)
        else:
            producer.send_bytes(topic, payload, key=key)
    producer.flush()


def rejected_on(kafka, topics: Topics, want: int) -> list[Rejected]:
    reader = TopicReader(kafka, [topics.rejected])
    try:
        reader.wait(lambda: len(reader.messages[topics.rejected]) >= want, 60, f"{want} rejected records")
        return [m.record for m in reader.messages[topics.rejected]]
    finally:
        reader.close()


def test_the_trainer_dead_letters_what_it_cannot_learn_from(kafka, ready):
    topics, producer = ready
    before, after = ready_group("before"), ready_group("after", version=VERSION - MAX_STALENESS)
    nan_adv = pack({**fields_of(ready_group("nan-adv", 1)[0]), "advantages": f32([float("nan")] * 3)})
    short = pack({**fields_of(ready_group("short", 1)[0]), "behaviour_logprobs": f32([-0.5] * 2)})
    hostile = [("garbage", b"\x00\xff not a record"), ("task", encode(Task(task_id="task", prompt="wrong topic"))),
               ("v3", pack({**fields_of(ready_group("v3", 1)[0]), "schema_version": 3})),
               ("nan-adv", nan_adv), ("short", short), ("too-big", bytes(MAX_RECORD_BYTES + 1)),
               *[(e.group_id, e) for e in ready_group("stale", version=VERSION - MAX_STALENESS - 1)],
               *[(e.group_id, e) for e in ready_group("no-logprobs", 1, behaviour_logprobs=[])],
               *[(e.group_id, e) for e in ready_group("no-advantages", 1, advantages=[])]]
    send(producer, topics.ready, [(e.group_id, e) for e in before] + hostile + [(e.group_id, e) for e in after])

    feed = trainer_intake(kafka, topics, producer, checks_staleness=True, max_staleness=MAX_STALENESS)
    try:
        trained = train_ids(feed, VERSION)
    finally:
        feed.close()
    assert sorted(trained) == ["after/0", "after/1", "before/0", "before/1"]

    dead = rejected_on(kafka, topics, len(hostile))
    assert len(dead) == len(hostile) and all(r.stage == "trainer" for r in dead)
    # Keyed by record id where the trainer could read one, else by the message key.
    by_key = {r.record_id or (r.original_key or b"").decode(): r for r in dead}
    assert {k: r.reason for k, r in by_key.items()} == {
        "garbage": "undecodable", "task": "unexpected_kind", "v3/0": "schema_too_new", "nan-adv/0": "invalid",
        "short/0": "invalid", "too-big": "too_large", "stale/0": "stale", "stale/1": "stale",
        "no-logprobs/0": "invalid", "no-advantages/0": "invalid"}
    assert "behaviour_logprobs: length 2 != response_tokens length 3" in by_key["short/0"].detail
    assert by_key["no-logprobs/0"].detail.startswith("behaviour_logprobs: empty")
    assert "policy_version 2 is 3 steps behind trainer step 5 (max_staleness 2)" in by_key["stale/0"].detail


def test_a_replayed_experience_id_is_trained_at_most_once(kafka, ready):
    topics, producer = ready
    first = ready_group("r")
    regenerated = [e.model_copy(update={"response_text": "regenerated", "reward": 1.0 - e.reward}) for e in first]
    # A redelivered group (identical), then the same ids with new content, all before the first
    # batch: the copies meet the original still waiting in the window.
    send(producer, topics.ready, [(e.group_id, e) for e in first + first + regenerated + ready_group("s")])
    feed = trainer_intake(kafka, topics, producer, checks_staleness=True, experiences=8)
    try:
        trained = train_ids(feed, VERSION)
        assert sorted(trained) == ["r/0", "r/1", "s/0", "s/1"]
        assert feed.counts.duplicates == 4
        # Replayed again after training, next to new work: only the new work is learned from.
        send(producer, topics.ready, [(e.group_id, e) for e in first + ready_group("t")])
        assert sorted(train_ids(feed, VERSION)) == ["t/0", "t/1"]
        remembered = feed.trained.to_list()
    finally:
        feed.close()
    # A restarted trainer whose offsets were lost reads everything again: the ids its checkpoint
    # remembers are skipped.
    restarted = trainer_intake(kafka, topics, producer, checks_staleness=True, trained_ids=remembered)
    try:
        assert train_ids(restarted, VERSION) == []
        assert restarted.counts.duplicates == 12
    finally:
        restarted.close()
