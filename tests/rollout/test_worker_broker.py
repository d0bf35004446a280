"""The rollout worker against the real broker: experiences, weight hot-swap, refused weights, redelivery."""

from __future__ import annotations

import threading

import pytest
from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition

from undertow.kernel.models import ModelSpec, build_model, weights_to_bytes
from undertow.schemas import Experience, Rejected, Task, chunk_weights
from undertow.streams import RecordProducer, Topics
from undertow.rollout.config import rollout_group
from undertow.rollout.worker import RolloutWorker
from tests.helpers import load_run, read_all, wait_for
from tests.rollout.test_generation import trainer_logprobs

pytestmark = [pytest.mark.broker, pytest.mark.slow]

ROLLOUT = {"sampling": {"max_new_tokens": 8, "temperature": 1.0}, "workflow": "single_turn",
           "reward": "numeric_match", "max_staleness": 0}


def publish_weights(producer: RecordProducer, topics: Topics, version: int, seed: int, corrupt: bool = False):
    chunks = chunk_weights("policy", version, weights_to_bytes(build_model(ModelSpec(seed=seed))), 64 << 10)
    if corrupt:  # same announced sha256, different bytes in one chunk
        chunks[1] = chunks[1].model_copy(update={"data": bytes(len(chunks[1].data))})
    for c in chunks:
        producer.send(topics.weights, c, key="policy")
    producer.flush()


def experiences_of(kafka, topics, task_id):
    return [e for e in read_all(kafka, topics.raw, Experience) if e.task_id == task_id]


def test_worker_publishes_experiences_and_hot_swaps_weights(kafka, namespace, config_path):
    config, context = load_run(config_path(rollout={**ROLLOUT, "max_staleness": 0}), kafka)
    topics = Topics(namespace)
    worker = RolloutWorker(config.rollout, context, "w0")
    stats = {}
    thread = threading.Thread(target=lambda: stats.update(done=worker.run(max_tasks=3)), daemon=True)
    thread.start()
    with RecordProducer(kafka) as producer:
        producer.send(topics.tasks, Task(task_id="t1", prompt="What is 2+3?", answer="5", group_size=3), key="t1")
        producer.flush()
        first = wait_for(lambda: len(experiences_of(kafka, topics, "t1")) == 3 and experiences_of(kafka, topics, "t1"),
                         what="experiences of t1")
        # A valid v1: with max_staleness 0 the worker must load it before its next generation.
        publish_weights(producer, topics, 1, seed=7)
        wait_for(lambda: worker.subscriber.latest_announced == 1, what="v1 announced")
        producer.send(topics.tasks, Task(task_id="t2", prompt="What is 1+1?", answer="2", group_size=2), key="t2")
        producer.flush()
        second = wait_for(lambda: experiences_of(kafka, topics, "t2"), what="experiences of t2")
        # A corrupted v2 is refused: the worker keeps v1. (max_staleness 0 would now wait for v3,
        # so loosen it to see the next task go through on v1.)
        worker.admission.max_staleness = 1
        publish_weights(producer, topics, 2, seed=8, corrupt=True)
        wait_for(lambda: worker.subscriber.refused == [2], what="v2 refused")
        producer.send(topics.tasks, Task(task_id="t3", prompt="What is 2+2?", answer="4", group_size=2), key="t3")
        producer.flush()
    thread.join(timeout=120)
    assert not thread.is_alive() and stats["done"].tasks == 3
    third = experiences_of(kafka, topics, "t3")

    assert [e.policy_version for e in first] == [0, 0, 0]
    assert {e.policy_version for e in second} == {1} and {e.policy_version for e in third} == {1}
    assert stats["done"].weight_swaps == 1
    for e in first + second + third:
        assert len(e.response_tokens) == len(e.behaviour_logprobs) == len(e.loss_mask) > 0
        assert e.experience_id == f"{e.group_id}/{e.sample_index}" and e.group_id == e.task_id
        assert set(e.timestamps) == {"created", "generated"} and "correct" in e.reward_components
        assert e.metadata["worker"] == "w0"
    assert sorted(e.sample_index for e in first) == [0, 1, 2]
    # v1's weights really generated t2: its log-probs are v1's, not v0's.
    e = second[0]
    assert max(abs(a - b) for a, b in zip(e.behaviour_logprobs, trainer_logprobs(ModelSpec(seed=7), [e], 1.0)[0])) <= 1e-4
    assert max(abs(a - b) for a, b in zip(e.behaviour_logprobs, trainer_logprobs(ModelSpec(), [e], 1.0)[0])) > 1e-2
    refused = [r for r in read_all(kafka, topics.rejected, Rejected) if r.stage == "weights"]
    assert len(refused) == 1 and refused[0].reason == "checksum" and "sha256" in refused[0].detail
    assert refused[0].record_id == "policy@v2"
    metrics = [m for m in read_all(kafka, topics.metrics) if m.component == "w0" and "tokens_per_s" in m.values]
    assert len(metrics) == 3 and metrics[-1].values["policy_version"] == 1.0
    assert all(0 < m.values["generate_s"] < 60 for m in metrics)  # the time the engine had work


def test_weights_announced_while_polling_bind_the_task_that_poll_returns(kafka, namespace, config_path):
    """The race behind a once-flaky hot-swap test: v1 lands while poll() waits, and poll() then
    returns a task. With max_staleness 0 that task must be generated on v1."""
    config, context = load_run(config_path(rollout=ROLLOUT), kafka)
    topics = Topics(namespace)
    worker = RolloutWorker(config.rollout, context, "w0")
    poll = worker.consumer.poll

    def poll_while_v1_lands(**kw):
        deliveries = poll(**kw)
        if deliveries and worker.subscriber.latest_announced == 0:
            with RecordProducer(kafka) as producer:
                publish_weights(producer, topics, 1, seed=7)
            wait_for(lambda: worker.subscriber.latest_announced == 1, what="v1 announced")
        return deliveries

    worker.consumer.poll = poll_while_v1_lands
    with RecordProducer(kafka) as producer:
        producer.send(topics.tasks, Task(task_id="t1", prompt="What is 2+3?", answer="5", group_size=2), key="t1")
    stats = worker.run(max_tasks=1)
    assert stats.weight_swaps == 1
    assert {e.policy_version for e in experiences_of(kafka, topics, "t1")} == {1}


def test_redelivered_task_yields_the_same_experience_ids(kafka, namespace, config_path):
    config, context = load_run(config_path(rollout=ROLLOUT), kafka)
    topics = Topics(namespace)
    with RecordProducer(kafka) as producer:
        producer.send(topics.tasks, Task(task_id="arith/1@0", prompt="1+1?", answer="2", group_size=2),
                      key="arith/1@0")
    assert RolloutWorker(config.rollout, context, "a").run(max_tasks=1).tasks == 1
    # As after a crash before the commit: the group's offsets go back, the task comes again.
    group = rollout_group(namespace)
    rewind = KafkaConsumer(**kafka.kafka_python(), group_id=group, enable_auto_commit=False)
    parts = [TopicPartition(topics.tasks, p) for p in rewind.partitions_for_topic(topics.tasks)]
    rewind.commit({tp: OffsetAndMetadata(0, "", -1) for tp in parts})
    rewind.close()
    assert RolloutWorker(config.rollout, context, "b").run(max_tasks=1).tasks == 1
    exps = read_all(kafka, topics.raw, Experience)
    assert sorted(e.experience_id for e in exps) == ["arith/1@0/0", "arith/1@0/0", "arith/1@0/1", "arith/1@0/1"]
    assert {e.metadata["worker"] for e in exps} == {"a", "b"}


def test_failing_workflow_dead_letters_the_task_and_goes_on(kafka, namespace, config_path):
    rollout = {**ROLLOUT, "reward": "countdown"}  # countdown needs metadata these tasks lack
    config, context = load_run(config_path(rollout=rollout), kafka)
    topics = Topics(namespace)
    with RecordProducer(kafka) as producer:
        producer.send(topics.tasks, Task(task_id="bad", prompt="x"), key="bad")
        producer.send_bytes(topics.tasks, b"not a record", key="junk")
    stats = RolloutWorker(config.rollout, context, "w").run(idle_timeout=3)
    assert stats.failed_tasks == 1 and stats.experiences == 0
    rejected = read_all(kafka, topics.rejected, Rejected)
    assert {(r.stage, r.reason) for r in rejected} == {("rollout", "workflow_error"), ("rollout", "undecodable")}
    assert any("numbers" in r.detail for r in rejected)


def spy_on_generate(worker: RolloutWorker) -> list[int]:
    """The number of prompts of each engine call the worker makes."""
    calls: list[int] = []
    generate = worker.engine.generate

    def counted(prompts, n, params):
        calls.append(len(prompts))
        return generate(prompts, n, params)

    worker.engine.generate = counted
    return calls


def committed(kafka, topics, group) -> int:
    """Tasks the rollout group has committed past, over all partitions."""
    consumer = KafkaConsumer(**kafka.kafka_python(), group_id=group, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topics.tasks, p) for p in consumer.partitions_for_topic(topics.tasks)]
        return sum(consumer.committed(tp) or 0 for tp in parts)
    finally:
        consumer.close()


def test_ready_tasks_are_generated_in_one_engine_call_and_all_committed(kafka, namespace, config_path):
    config, context = load_run(config_path(rollout={**ROLLOUT, "batch_tasks": 4}), kafka)
    topics = Topics(namespace)
    with RecordProducer(kafka) as producer:
        for i in range(6):
            producer.send(topics.tasks, Task(task_id=f"b{i}", prompt=f"{i}+1=", answer=str(i + 1), group_size=2),
                          key=f"b{i}")
    worker = RolloutWorker(config.rollout, context, "w0")
    calls = spy_on_generate(worker)
    stats = worker.run(max_tasks=6)
    assert stats.tasks == 6 and sum(calls) == 6
    assert max(calls) == 4 and len(calls) <= 3  # task by task would be six calls of one prompt
    exps = read_all(kafka, topics.raw, Experience)
    assert sorted(e.experience_id for e in exps) == sorted(f"b{i}/{j}" for i in range(6) for j in range(2))
    assert all(f"{e.task_id[1:]}+1=" in e.prompt_text for e in exps)
    # Each task got its own samples back: their log-probs are those of its prompt followed by them.
    recomputed = trainer_logprobs(ModelSpec(), exps, 1.0)
    assert max(abs(a - b) for e, r in zip(exps, recomputed) for a, b in zip(e.behaviour_logprobs, r)) <= 1e-4
    assert committed(kafka, topics, rollout_group(namespace)) == 6
    batches = [m.values["batch_tasks"] for m in read_all(kafka, topics.metrics) if "batch_tasks" in m.values]
    assert sum(batches) == 6 and max(batches) == 4


def test_a_batch_is_cut_to_the_admission_budget_and_the_rest_read_again(kafka, namespace, config_path):
    """Budget 5 experiences on v0, groups of 2: three tasks fit (a task is admitted while anything is
    left), the fourth goes back to the consumer and comes in the next batch, once the budget renews."""
    rollout = {**ROLLOUT, "batch_tasks": 8, "experiences_per_version": 5, "cap_wait_s": 1.0}
    config, context = load_run(config_path(rollout=rollout), kafka)
    topics = Topics(namespace)
    with RecordProducer(kafka) as producer:
        for i in range(4):  # one key: one partition, read in order
            producer.send(topics.tasks, Task(task_id=f"c{i}", prompt=f"{i}+2=", answer=str(i + 2), group_size=2),
                          key="same")
    worker = RolloutWorker(config.rollout, context, "w0")
    calls = spy_on_generate(worker)
    stats = worker.run(max_tasks=4, idle_timeout=10)  # without the give-back the fourth task never comes
    assert calls == [3, 1] and stats.tasks == 4 and stats.waits > 0
    exps = read_all(kafka, topics.raw, Experience)
    assert sorted(e.experience_id for e in exps) == sorted(f"c{i}/{j}" for i in range(4) for j in range(2))
    assert committed(kafka, topics, rollout_group(namespace)) == 4


def test_a_batch_longer_than_the_poll_interval_keeps_its_group_membership(kafka, namespace, config_path, monkeypatch):
    """A batch may outlast the consumer's max.poll.interval (long episodes, a slow CPU): the worker
    polls (taking nothing) while the workflow runs on its own thread, so the group keeps the worker's
    partitions and takes its commit. Without that, the group drops the member mid-batch and the
    commit is refused (CommitFailedError: the worker crashed, its tasks generated again)."""
    import functools

    from undertow.streams import RecordConsumer

    monkeypatch.setattr("undertow.rollout.worker.RecordConsumer", functools.partial(RecordConsumer,
                                                                                   max_poll_interval_ms=3_000))
    slow = {**ROLLOUT, "batch_tasks": 2, "reward": {"name": "tests.rollout.plugins.remote_verifier", "seconds": 2.0}}
    config, context = load_run(config_path(rollout=slow), kafka)
    topics = Topics(namespace)
    with RecordProducer(kafka) as producer:
        for i in range(2):  # one batch: 2 tasks x 2 samples x 2 s of reward = 8 s, past the 3-s interval
            producer.send(topics.tasks, Task(task_id=f"s{i}", prompt="1+1?", answer="2", group_size=2), key="s")
    assert RolloutWorker(config.rollout, context, "w0").run(max_tasks=2).tasks == 2
    assert sorted(e.experience_id for e in read_all(kafka, topics.raw, Experience)) == ["s0/0", "s0/1", "s1/0", "s1/1"]
    assert committed(kafka, topics, rollout_group(namespace)) == 2


def test_a_worker_the_group_took_for_dead_generates_its_tasks_again_and_does_not_crash(kafka, namespace, config_path,
                                                                                      monkeypatch):
    """A main loop that does not poll past max.poll.interval (here: stalled once; in a long broker outage
    the member's session ends alike): the group moves its partitions and refuses its commit. The worker
    goes on: its next poll rejoins, it reads the same tasks again and commits them; their experiences
    repeat with the same ids (dropped downstream), and none is missing."""
    import functools
    import time

    from undertow.streams import RecordConsumer

    monkeypatch.setattr("undertow.rollout.worker.RecordConsumer", functools.partial(RecordConsumer,
                                                                                   max_poll_interval_ms=3_000))
    real, stalled = RolloutWorker._generate, []

    def stalled_once(self, tasks):
        if not stalled:
            stalled.append(len(tasks))
            time.sleep(6)  # no poll: the group drops this member after 3 s
        return real(self, tasks)

    monkeypatch.setattr(RolloutWorker, "_generate", stalled_once)
    config, context = load_run(config_path(rollout={**ROLLOUT, "batch_tasks": 2}), kafka)
    topics = Topics(namespace)
    with RecordProducer(kafka) as producer:
        for i in range(2):
            producer.send(topics.tasks, Task(task_id=f"d{i}", prompt="1+1?", answer="2", group_size=2), key="d")
    stats = RolloutWorker(config.rollout, context, "w0").run(max_tasks=2)
    assert stalled == [2] and stats.commits_refused == 1 and stats.tasks == 2
    ids = [e.experience_id for e in read_all(kafka, topics.raw, Experience)]
    assert sorted(set(ids)) == ["d0/0", "d0/1", "d1/0", "d1/1"] and len(ids) == 8  # each generated twice
    assert committed(kafka, topics, rollout_group(namespace)) == 2
