"""The processor app against the real broker, with real Faust workers started as `undertow process`."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from undertow.schemas import Experience, MetricEvent, Rejected, TaskStat
from undertow.streams import RecordConsumer, RecordProducer, Topics
from tests.helpers import exp, experience_ids_at, raw_assignment, read_again, read_all, take, wait_for

pytestmark = [pytest.mark.broker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
PIPELINE = [{"name": "clean", "max_response_tokens": 20}, "tests.processors.plugins.shout",
            {"name": "reshape", "advantage": "rloo", "dynamic_sampling": True}, "prioritize"]


def start(tmp_path: Path, namespace: str, workers: int = 1, **section) -> subprocess.Popen:
    section = {"pipeline": PIPELINE, "app_id": f"proc-{namespace}", "metrics_every_s": 1.0,
               "group_timeout_s": 120, **section}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"namespace": namespace, "processors": section}))
    log = open(tmp_path / f"process-{workers}.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "undertow.infra.cli", "process", str(config), "--workers", str(workers)],
                            cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    proc.log = Path(log.name)  # what read() shows when the records it waits for do not come
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def read(kafka, topic: str, expect, want: int, timeout: float = 120.0, proc=None) -> list:
    with RecordConsumer(kafka, [topic], group_id=None, expect=expect, rejected_topic=topic + ".unused") as c:
        got = take(c, want, timeout, f"{want} records on {topic}", proc=proc, log=getattr(proc, "log", None))
        got += c.poll(timeout_ms=1000)  # anything beyond `want` shows up too
    return [d.record for d in got]


# RLOO (Ahmadian et al. 2024): A_i = r_i − mean of the others = (G·r_i − Σr) / (G − 1), worked by hand
# for each group's rewards (G = 4). g0 loses sample 1 (too long): rewards 1, 0, 0 over samples 0, 2, 3.
RLOO = {(1.0, 0.0, 0.0, 0.0): [1.0, -1 / 3, -1 / 3, -1 / 3],  # Σr = 1: (4 − 1)/3, (0 − 1)/3
        (1.0, 0.5, 0.5, 0.0): [2 / 3, 0.0, 0.0, -2 / 3],      # Σr = 2: (4 − 2)/3, (2 − 2)/3, (0 − 2)/3
        (0.5, 0.0, 1.0, 1.0): [-1 / 6, -5 / 6, 0.5, 0.5]}     # Σr = 2.5: (2 − 2.5)/3, (0 − 2.5)/3, (4 − 2.5)/3
G0_WITHOUT_SAMPLE_1 = {0: 1.0, 2: -0.5, 3: -0.5}  # G = 3, Σr = 1: (3 − 1)/2, (0 − 1)/2


def test_groups_advantages_and_rejects_through_a_faust_worker(kafka, namespace, tmp_path):
    topics, rng = Topics(namespace), random.Random(4)
    patterns = list(RLOO)
    rewards = {f"g{i}": list(patterns[i % len(patterns)]) for i in range(12)}  # g0: 1, 0, 0, 0
    rewards["flat"] = [1.0] * 4
    samples = [exp(g, i, 4, r, text=f"answer {g} {i}") for g, rs in rewards.items() for i, r in enumerate(rs)]
    samples[1] = exp("g0", 1, 4, 0.0, text="way too long", tokens=30)
    rng.shuffle(samples)  # groups interleaved across the 4 partitions, samples out of order
    proc = start(tmp_path, namespace)
    try:
        with RecordProducer(kafka) as p:
            for e in samples:
                p.send(topics.raw, e, key=e.group_id)
            p.send(topics.raw, samples[0], key=samples[0].group_id)  # a redelivery
            p.send_bytes(topics.raw, b"\xc1 not msgpack", key="g1")
        published = len(samples) + 2
        ready = read(kafka, topics.ready, Experience, published - 7, proc=proc)
        rejected = read(kafka, topics.rejected, Rejected, 7)
        assert proc.poll() is None, (tmp_path / "process-1.log").read_text()[-3000:]
        assert len(ready) + len(rejected) == published  # every input accounted for
        reasons = Counter((r.stage, r.reason) for r in rejected)
        assert reasons == {("reshape", "zero_variance"): 4, ("clean", "duplicate"): 1, ("clean", "too_long"): 1,
                           ("decode", "undecodable"): 1}
        assert {r.record_id for r in rejected if r.reason == "zero_variance"} == {f"flat/{i}" for i in range(4)}
        assert len({e.experience_id for e in ready}) == len(ready) == 12 * 4 - 1
        for e in ready:
            if e.group_id == "g0":
                want = G0_WITHOUT_SAMPLE_1[e.sample_index]
            else:
                want = RLOO[tuple(rewards[e.group_id])][e.sample_index]
            assert e.advantages == pytest.approx([want] * 3, abs=1e-6), e.experience_id
            assert e.response_text == f"ANSWER {e.group_id.upper()} {e.sample_index}!"  # the plugin ran
            assert e.priority == pytest.approx(0.01 + abs(want), abs=1e-6)
        stats = read(kafka, topics.task_stats, TaskStat, 12)
        assert {s.task_id for s in stats} >= {f"g{i}" for i in range(12)}
        metrics = read(kafka, topics.metrics, MetricEvent, 1, timeout=30)
        assert any(m.values.get("clean.in", 0) >= 1 for m in metrics)
    finally:
        stop(proc)


def test_two_workers_split_the_partitions_without_loss_or_duplication(kafka, namespace, tmp_path):
    topics = Topics(namespace)
    proc = start(tmp_path, namespace, workers=2, pipeline=["clean", "reshape"])
    try:
        # Both workers hold raw partitions before records flow: a rebalance mid-stream hands a worker's
        # uncommitted records to the other, which counts them again (at-least-once; dedupe drops them).
        wait_for(lambda: len([held for held in raw_assignment(kafka, f"proc-{namespace}", topics.raw) if held]) == 2,
                 timeout=120, what="both workers holding raw partitions", proc=proc)
        samples = [exp(f"w{g}", i, 2, float(i), text=f"a{i}") for g in range(60) for i in range(2)]
        with RecordProducer(kafka) as p:
            for e in samples:
                p.send(topics.raw, e, key=e.group_id)
        ready = read(kafka, topics.ready, Experience, len(samples), proc=proc)
        assert proc.poll() is None, (tmp_path / "process-2.log").read_text()[-3000:]
        assert sorted(e.experience_id for e in ready) == sorted(e.experience_id for e in samples)

        def per_worker() -> dict[str, float]:
            """Each worker's latest count of records in (counters only grow; metrics come every second)."""
            counts: dict[str, float] = {}
            for m in read_all(kafka, topics.metrics, MetricEvent):
                counts[m.labels["worker"]] = max(counts.get(m.labels["worker"], 0), m.values.get("clean.in", 0))
            return counts

        wait_for(lambda: sum(per_worker().values()) >= len(samples), 60, "both workers' metrics to count every record",
                 proc=proc, state=per_worker, every=0.5)
        counts = per_worker()
        assert set(counts) == {"worker-0", "worker-1"}
        assert all(n > 0 for n in counts.values()) and sum(counts.values()) == len(samples)
    finally:
        stop(proc)


def test_open_groups_survive_a_worker_restart(kafka, namespace, tmp_path):
    """Group state is in a changelogged Faust table: a new worker resumes a half-assembled group."""
    topics = Topics(namespace)
    samples = [exp("r", i, 4, float(i), text=f"a{i}") for i in range(4)]
    proc = start(tmp_path, namespace, pipeline=["reshape"])
    try:
        with RecordProducer(kafka) as p:
            for e in samples[:3]:
                p.send(topics.raw, e, key=e.group_id)
        probe = exp("probe", 0, 1)
        with RecordProducer(kafka) as p:
            p.send(topics.raw, probe, key=probe.group_id)
        assert [e.experience_id for e in read(kafka, topics.ready, Experience, 1, proc=proc)] == ["probe/0"]
    finally:
        stop(proc)
    proc = start(tmp_path, namespace, pipeline=["reshape"])
    try:
        with RecordProducer(kafka) as p:
            p.send(topics.raw, samples[3], key="r")
        ready = read(kafka, topics.ready, Experience, 5, proc=proc)
        assert sorted(e.experience_id for e in ready) == ["probe/0", "r/0", "r/1", "r/2", "r/3"]
        r = {e.sample_index: e for e in ready if e.group_id == "r"}
        assert r[0].advantages[0] == pytest.approx(-1.5 / (5 / 3) ** 0.5, abs=1e-5)  # grpo over 0, 1, 2, 3
    finally:
        stop(proc)


def test_a_worker_killed_mid_stream_loses_nothing(kafka, namespace, tmp_path):
    """SIGKILL under load, then a new worker after a backlog built up: every record ends ready or
    rejected; only what the killed worker had not committed is handled twice, and no record is taken
    for a duplicate of an output that never reached the broker. A starting worker's streams often miss
    a run of offsets (Faust; streams/faust/books.py), read again at once: the delivery watch, the slow
    backstop, is set beyond this test's patience. The unit tests in tests/streams/test_faust_books.py
    and test_faust_tables.py pin the mechanisms down."""
    topics = Topics(namespace)
    section = dict(pipeline=["clean", {"name": "reshape", "advantage": "grpo"}], resync_after_s=600)
    sent: list[str] = []

    def publish() -> None:
        with RecordProducer(kafka) as p:
            for g in range(1000):
                for e in [exp(f"k{g}", i, 4, float(i % 2), text=f"a{g} {i}") for i in range(4)]:
                    p.send(topics.raw, e, key=e.group_id)
                    sent.append(e.experience_id)
                time.sleep(0.01)

    writer = threading.Thread(target=publish, daemon=True)
    proc = start(tmp_path, namespace, **section)
    try:
        writer.start()
        # Killed once it has committed some of what it handled: a record below its commit must not
        # be handled again, one above it may.
        wait_for(lambda: sum(r.start for r in read_again(kafka, f"proc-{namespace}", topics.raw).values()) >= 800,
                 90, "the worker to commit 800 records", proc=proc, every=0.5)
        proc.kill()
        proc.wait()
        killed_at = len(sent)
        redelivered = read_again(kafka, f"proc-{namespace}", topics.raw)
        wait_for(lambda: len(sent) >= killed_at + 400 or not writer.is_alive(), 60,
                 "a backlog to build up beyond what the killed worker read", every=0.05)
        proc = start(tmp_path, namespace, **section)
        writer.join()
        ready, rejected = [], []

        def all_resolved() -> bool:
            ready[:] = read_all(kafka, topics.ready, Experience)
            rejected[:] = read_all(kafka, topics.rejected, Rejected)
            return {e.experience_id for e in ready} | {r.record_id for r in rejected} >= set(sent)

        wait_for(all_resolved, 150, "every record sent to be ready or rejected", proc=proc, every=2,
                 state=lambda: f"{len(ready)} ready, {len(rejected)} rejected of {len(sent)} sent; worker log:\n"
                               + proc.log.read_text()[-3000:])
    finally:
        stop(proc)
    ids = [e.experience_id for e in ready]
    lost = set(sent) - set(ids) - {r.record_id for r in rejected}
    assert not lost, f"{len(lost)} of {len(sent)} records neither ready nor rejected, e.g. {sorted(lost)[:5]}"
    # At-least-once: the killed worker's handled but uncommitted records are read again. Clean's dedupe
    # window rejects those whose state change had reached the changelog; one whose output was
    # acknowledged and whose change was not yet is made ready again (the trainer's ledger drops it).
    # ("None made ready twice", asserted here until 2026-12-06, failed once on CI: 238 such.)
    twice = {i for i, n in Counter(ids).items() if n > 1}
    allowed = experience_ids_at(kafka, topics.raw, redelivered)
    assert twice <= allowed, f"{len(twice - allowed)} records the killed worker had committed were made ready twice"
    print(f"{len(twice)} of the {len(allowed)} records read again made ready twice")
    # Never the other way round: a change goes to the changelog after the outputs it accounts for.
    taken_for_duplicates = {r.record_id for r in rejected if r.reason == "duplicate"}
    assert taken_for_duplicates <= set(ids), f"{len(taken_for_duplicates - set(ids))} records rejected as duplicates never made ready"
    assert {r.reason for r in rejected} <= {"duplicate"}  # the killed worker's uncommitted records, read again
