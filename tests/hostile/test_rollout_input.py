"""Hostile records on <ns>.tasks (a rollout worker) and <ns>.weights (its weight subscriber)."""

from __future__ import annotations

import threading

import pytest

from undertow.schemas import Experience, Rejected, Task, WeightUpdate, chunk_weights
from undertow.streams import RecordProducer, Topics
from undertow.rollout.weight_subscriber import WeightSubscriber
from undertow.rollout.worker import RolloutWorker
from tests.hostile.helpers import fields_of, fresh_namespace, pack
from tests.helpers import load_run, read_all, wait_for, write_config

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def task(task_id: str, hostile: str | None = None, size: int = 2) -> Task:
    return Task(task_id=task_id, prompt="What is 3+4?", answer="7", group_size=size,
                metadata={"hostile": hostile} if hostile else {})


def test_a_rollout_worker_dead_letters_bad_tasks_and_oversize_experiences(kafka, tmp_path):
    namespace = fresh_namespace(kafka, "tasks")
    topics = Topics(namespace)
    path = write_config(tmp_path / "run.yaml", namespace,
                        rollout={"workflow": "tests.hostile.rollout_plugins.scripted", "max_staleness": 100},
                        trainer={"batching": {"max_staleness": 100}})
    cfg, context = load_run(path, kafka)
    worker = RolloutWorker(cfg.rollout, context, "w")
    stats = {}
    thread = threading.Thread(target=lambda: stats.update(done=worker.run(idle_timeout=3)), daemon=True)
    with RecordProducer(kafka) as producer:
        producer.send(topics.tasks, task("first"), key="x", partition=0)
        producer.send_bytes(topics.tasks, b"\xc1 not a task", key="x", partition=0)
        producer.send_bytes(topics.tasks, pack({**fields_of(task("v9")), "schema_version": 9}), key="x", partition=0)
        producer.send_bytes(topics.tasks, pack({**fields_of(task("extra")), "priority": 3}), key="x", partition=0)
        producer.send(topics.tasks, Experience(experience_id="e", task_id="e", group_id="e", prompt_tokens=[1],
                                               response_tokens=[2], policy_version=0, finish_reason="stop"),
                      key="x", partition=0)
        producer.send(topics.tasks, task("raises", "raise"), key="x", partition=0)
        producer.send(topics.tasks, task("huge", "huge"), key="x", partition=0)
        producer.send(topics.tasks, task("last"), key="x", partition=0)
    thread.start()
    thread.join(timeout=300)
    assert not thread.is_alive(), "the worker did not stop"
    assert "done" in stats, "the worker died (see the log above)"
    assert stats["done"].tasks == 4 and stats["done"].failed_tasks == 1  # the undecodable ones are no tasks

    experiences = read_all(kafka, topics.raw, Experience)
    assert sorted(e.experience_id for e in experiences) == ["first/0", "first/1", "huge/1", "last/0", "last/1"]
    rejected = read_all(kafka, topics.rejected, Rejected)
    dead = {r.record_id or r.original_key.decode(): r for r in rejected}
    assert len(rejected) == len(dead) and {k: (r.stage, r.reason) for k, r in dead.items()} == {
        "x": ("rollout", "undecodable"), "v9": ("rollout", "schema_too_new"), "extra": ("rollout", "invalid"),
        "e": ("rollout", "unexpected_kind"), "raises": ("rollout", "workflow_error"),
        "huge/0": ("rollout", "too_large")}
    assert "priority" in dead["extra"].detail and "workflow bug on purpose" in dead["raises"].detail
    assert "bytes > max" in dead["huge/0"].detail


def blob(seed: int, size: int = 3000) -> bytes:
    return bytes((seed * 31 + i * 7) % 251 for i in range(size))


def test_the_weight_subscriber_refuses_bad_updates_and_keeps_its_weights(kafka):
    topics = Topics(fresh_namespace(kafka, "weights"))
    producer = RecordProducer(kafka)
    subscriber = WeightSubscriber(kafka, topics, "policy", producer)
    subscriber.start()

    def send(chunks: list[WeightUpdate]) -> None:
        for c in chunks:
            producer.send(topics.weights, c, key="policy")
        producer.flush()

    try:
        send(chunk_weights("policy", 1, blob(1), 1024))
        assert wait_for(subscriber.take, what="v1").blob == blob(1)

        bad_sum = chunk_weights("policy", 2, blob(2), 1024)
        bad_sum[1] = bad_sum[1].model_copy(update={"data": bytes(len(bad_sum[1].data))})  # same size, other bytes
        cut = chunk_weights("policy", 3, blob(3), 1024)
        cut[2] = cut[2].model_copy(update={"data": cut[2].data[:100]})  # a truncated chunk
        missing = chunk_weights("policy", 4, blob(4), 1024)[:2]  # its last chunk never comes
        out_of_range = pack({**fields_of(chunk_weights("policy", 5, blob(5), 1024)[0]), "chunk_index": 7})
        send(bad_sum + cut + missing)
        producer.send_bytes(topics.weights, b"\xc1 not an update", key="junk")
        producer.send_bytes(topics.weights, out_of_range, key="policy")
        producer.flush()
        wait_for(lambda: subscriber.refused == [2, 3], what="v2 and v3 refused")
        assert subscriber.take() is None  # nothing replaces v1
        send(chunk_weights("policy", 6, blob(6), 1024))
        newest = wait_for(subscriber.take, what="v6")
        assert (newest.version, newest.blob) == (6, blob(6))
        assert subscriber.is_alive()
    finally:
        subscriber.stop()
        producer.close()

    rejected = read_all(kafka, topics.rejected, Rejected)
    dead = {r.record_id or r.original_key.decode(): r for r in rejected}
    assert len(rejected) == len(dead) and {k: (r.stage, r.reason) for k, r in dead.items()} == {
        "policy@v2": ("weights", "checksum"), "policy@v3": ("weights", "checksum"),
        "policy@v4": ("weights", "incomplete"), "junk": ("weights", "undecodable"), "policy": ("weights", "invalid")}
    assert "sha256" in dead["policy@v2"].detail and "expected total_bytes 3000" in dead["policy@v3"].detail
    assert "2 of 3 chunks" in dead["policy@v4"].detail
