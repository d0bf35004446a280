"""Weights by files and by broadcast through the real broker: a rollout worker swaps each good version,
refuses each bad one with a reason while it goes on generating, and the topic holds announcements only."""

from __future__ import annotations

import threading
import time

import pytest

from undertow.kernel.models import ModelSpec, build_model, weights_to_bytes
from undertow.kernel.models.weights import state_tensors
from undertow.rollout.engines import build_engine
from undertow.rollout.weight_subscriber import WeightSubscriber
from undertow.rollout.worker import RolloutWorker
from undertow.schemas import Experience, MetricEvent, Rejected, Task, WeightUpdate, announce_buckets
from undertow.streams import RecordProducer, Topics
from undertow.streams.weights import BroadcastSender, FilesSender, Sending, WeightsConfig, publish_weights, rendezvous
from tests.helpers import load_run, read_all, wait_for, write_config
from tests.rollout.test_generation import trainer_logprobs

pytestmark = [pytest.mark.broker, pytest.mark.slow]

ROLLOUT = {"sampling": {"max_new_tokens": 8, "temperature": 1.0}, "workflow": "single_turn",
           "reward": "numeric_match", "max_staleness": 100}
TRAINER = {"batching": {"max_staleness": 100}}  # the trainer's bound no lower than the workers'


def tensors(seed: int) -> dict:
    return state_tensors(build_model(ModelSpec(seed=seed)))


def ask(producer, topics, task_id: str) -> None:
    producer.send(topics.tasks, Task(task_id=task_id, prompt="What is 2+3?", answer="5", group_size=2), key=task_id)
    producer.flush()


def experiences(kafka, topics, task_id):
    return wait_for(lambda: [e for e in read_all(kafka, topics.raw, Experience) if e.task_id == task_id],
                    what=f"experiences of {task_id}")


def generated_by(e: Experience, seed: int) -> bool:
    theirs = trainer_logprobs(ModelSpec(seed=seed), [e], 1.0)[0]
    return max(abs(a - b) for a, b in zip(e.behaviour_logprobs, theirs)) <= 1e-4


def test_files_swap_good_versions_and_refuse_bad_ones_while_generating(kafka, namespace, tmp_path):
    config, context = load_run(write_config(tmp_path / "run.yaml", namespace, rollout=ROLLOUT, trainer=TRAINER), kafka)
    topics = Topics(namespace)
    worker = RolloutWorker(config.rollout, context, "w0")
    stats = {}
    thread = threading.Thread(target=lambda: stats.update(done=worker.run(max_tasks=4)), daemon=True)
    thread.start()
    cfg = WeightsConfig(transport="files", uri=str(tmp_path / "weights"), bucket_bytes=20_000, keep=10)
    with RecordProducer(kafka) as producer:
        sender = FilesSender(Sending("policy", cfg, producer, topics, "full", kafka))
        ask(producer, topics, "t0")
        experiences(kafka, topics, "t0")
        sender.publish(1, sender.pack(tensors(7), None))
        wait_for(lambda: worker.admission.held == 1, what="v1 loaded")
        ask(producer, topics, "t1")
        on_v1 = experiences(kafka, topics, "t1")

        def announce_spoiled(version: int, spoil) -> None:
            buckets = sender.pack(tensors(version), None)
            manifest = sender.write(version, buckets)
            folder = tmp_path / "weights" / "policy" / f"v{version:08d}"
            update = announce_buckets("policy", version, spoil(folder, manifest), transport="files",
                                      uri=sender.version_uri(version))
            publish_weights(producer, topics.weights, [update])
            # One at a time: announcements read in one poll skip the superseded ones (rightly), and
            # a spoiled version never fetched would never be refused.
            wait_for(lambda: version in worker.subscriber.refused, what=f"v{version} refused")

        def flip_a_byte(folder, manifest):
            path = folder / manifest[1].file
            data = bytearray(path.read_bytes())
            data[-1] ^= 1
            path.write_bytes(bytes(data))
            return manifest

        def drop_a_file(folder, manifest):
            (folder / manifest[-1].file).unlink()
            return manifest

        def misname_a_tensor(folder, manifest):
            first = manifest[0]
            wrong = first.tensors[0].model_copy(update={"name": "not.in.the.file"})
            return [first.model_copy(update={"tensors": (wrong, *first.tensors[1:])}), *manifest[1:]]

        announce_spoiled(2, flip_a_byte)
        announce_spoiled(3, drop_a_file)
        announce_spoiled(4, misname_a_tensor)
        assert worker.subscriber.refused == [2, 3, 4]
        ask(producer, topics, "t2")
        still_v1 = experiences(kafka, topics, "t2")
        sender.publish(5, sender.pack(tensors(9), None))
        wait_for(lambda: worker.admission.held == 5, what="v5 loaded")
        ask(producer, topics, "t3")
        on_v5 = experiences(kafka, topics, "t3")
    thread.join(timeout=120)
    assert not thread.is_alive() and stats["done"].tasks == 4 and stats["done"].weight_swaps == 2

    assert {e.policy_version for e in on_v1} == {1} and generated_by(on_v1[0], 7)
    assert {e.policy_version for e in still_v1} == {1} and generated_by(still_v1[0], 7)
    assert {e.policy_version for e in on_v5} == {5} and generated_by(on_v5[0], 9)
    refused = {r.record_id: r for r in read_all(kafka, topics.rejected, Rejected) if r.stage == "weights"}
    assert {k: r.reason for k, r in refused.items()} == {
        "policy@v2": "checksum", "policy@v3": "missing", "policy@v4": "manifest"}
    swaps = [m for m in read_all(kafka, topics.metrics, MetricEvent) if "weight_swap_s" in m.values]
    assert [m.step for m in swaps] == [1, 5] and all(0 < m.values["weight_swap_s"] < 5 for m in swaps)
    updates = read_all(kafka, topics.weights, WeightUpdate)
    assert len(updates) == 5 and all(u.data is None and u.transport == "files" for u in updates)


def test_broadcast_reaches_the_joined_worker_and_survives_a_dead_one(kafka, namespace, tmp_path):
    topics = Topics(namespace)
    cfg = WeightsConfig(transport="broadcast", uri=str(tmp_path / "weights"), bucket_bytes=20_000,
                        broadcast={"join_timeout_s": 2, "timeout_s": 3})  # the worker waits 3 s: longer than the join
    with RecordProducer(kafka) as producer:
        subscriber = WeightSubscriber(kafka, topics, "policy", producer, staging_dir=str(tmp_path),
                                      broadcast_timeout_s=3)
        subscriber.start()
        assert subscriber.caught_up.wait(30)
        sender = BroadcastSender(Sending("policy", cfg, producer, topics, "full", kafka))
        engine = build_engine("transformers", ModelSpec())
        try:
            def next_version(version: int, seed: int):
                started = time.monotonic()
                sender.publish(version, sender.pack(tensors(seed), None))
                # The trainer hands over and trains on: waiting for the round would take the join's 2 s.
                assert time.monotonic() - started < 2
                ready = wait_for(lambda: (r := subscriber.take()) and r.version == version and r, timeout=60,
                                 what=f"v{version}")
                assert subscriber.load(ready, engine) is not None
                assert weights_to_bytes(engine.model) == weights_to_bytes(build_model(ModelSpec(seed=seed)))
                return ready.via

            # v1: nobody was expected yet, so the worker came late and took the files.
            assert next_version(1, seed=1) == "files"
            assert next_version(2, seed=2) == "broadcast"  # now it is expected, and joins in time
            # v3: a second worker, late for v2 (so expected now), joins and dies before the group
            # forms; the trainer's thread times out, so does the live worker's receive (refused:
            # broadcast), and the files bring v3.
            ghost = rendezvous.connect(sender.rendezvous, 10)
            rendezvous.attempt(ghost, 2, "")  # a worker with the run's token (none is set here)
            rendezvous.attempt(ghost, 3, "")
            assert next_version(3, seed=3) == "files"
            assert next_version(4, seed=4) == "broadcast"  # the dead one is not waited for again
        finally:
            sender.close()
            subscriber.stop()
    rounds = {r["version"]: (r["members"], r["sent"]) for r in sender.rounds}
    assert rounds == {1: (0, False), 2: (1, True), 3: (2, False), 4: (1, True)}
    assert [r.record_id for r in read_all(kafka, topics.rejected, Rejected) if r.reason == "broadcast"] == ["policy@v3"]
    updates = read_all(kafka, topics.weights, WeightUpdate)
    assert [(u.version, u.transport) for u in updates] == [
        (v, t) for v in (1, 2, 3, 4) for t in ("broadcast", "files")]
    assert all(u.data is None for u in updates)
    sent = [m for m in read_all(kafka, topics.metrics, MetricEvent) if m.component == "trainer-weights"]
    assert [m.values["broadcast_sent"] for m in sent] == [0.0, 1.0, 0.0, 1.0]
