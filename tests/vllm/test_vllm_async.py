"""The continuous-batching vLLM engine (rollout/engines/vllm_async.py) against real vLLM (CPU): the
batch engine's greedy answers, groups back as they finish, in-flight weight updates with each token's
log-prob from its own weights, drain; and the rollout worker on it (rollout/continuous.py) that
survives a SIGKILL.

One async engine for the whole module: vLLM takes tens of seconds to start.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from undertow.kernel.models import ModelSpec, build_model, weights_to_bytes
from undertow.schemas import Experience, Task, chunk_weights
from undertow.streams import RecordProducer, Topics
from undertow.rollout.engines import SamplingParams, build_engine
from tests.helpers import load_run, read_all, wait_for, write_config
from tests.vllm.engine_checks import TOLERANCE, fields, prompts_of, worst_gap
from tests.vllm.trainer_logprobs import trainer_logprobs


@pytest.fixture(scope="module")
def async_engine(spec):
    started = time.monotonic()
    engine = build_engine({"name": "vllm_async", "max_model_len": 512, "seed": 0, "max_inflight": 64}, spec)
    print(f"vLLM async engine start-up: {time.monotonic() - started:.1f} s")
    yield engine
    engine.close()


def test_the_async_engines_greedy_answers_are_the_batch_engines(engine, async_engine):
    prompts = prompts_of(engine, "What is 2+3?", "Add 1 and 4, then say it twice please", "hi")
    params = SamplingParams(greedy=True, max_new_tokens=24)
    want, got = engine.generate(prompts, 2, params), async_engine.generate(prompts, 2, params)
    assert [[s.tokens for s in g] for g in got] == [[s.tokens for s in g] for g in want]
    assert max(abs(a - b) for gg, wg in zip(got, want) for g, w in zip(gg, wg)
               for a, b in zip(g.logprobs, w.logprobs)) <= TOLERANCE
    assert all(s.versions == [0] * len(s.tokens) for g in got for s in g)


def test_groups_come_back_as_they_finish_and_none_is_lost(async_engine):
    """One long group submitted first, ten short ones after it: the short ones come back first."""
    from concurrent.futures import as_completed

    prompt = prompts_of(async_engine, "Count to a hundred")[0]
    # EOS comes ~1 in 100 tokens with these weights: all 8 long samples ending within 30 is p ~ 1e-5.
    futures = {async_engine.submit(prompt, 8, SamplingParams(max_new_tokens=300)): "long"}
    futures.update({async_engine.submit(prompt, 2, SamplingParams(max_new_tokens=3)): i for i in range(10)})
    order = [futures[f] for f in as_completed(futures, timeout=120)]
    assert sorted(order, key=str) == sorted(futures.values(), key=str)  # every group, once
    assert order[-1] == "long"  # submitted first, finished last
    groups = {futures[f]: f.result() for f in futures}
    assert all(len(groups[i]) == 2 and all(len(s.tokens) <= 3 for s in groups[i]) for i in range(10))
    assert len(groups["long"]) == 8 and max(len(s.tokens) for s in groups["long"]) > 30


@pytest.mark.parametrize("load", ["blob", "files"])
def test_a_sequence_spans_a_swap_with_each_tokens_logprob_from_its_own_weights(
        async_engine, spec, original, tmp_path, load):
    """Swapped from another thread mid-generation: the in-flight samples carry tokens of both versions,
    and each token's behaviour log-prob is the trainer's under the weights of its version."""
    from safetensors.torch import load as load_tensors

    from undertow.kernel.models.weights import to_buckets
    from tests.vllm.tiny_llama import save_tiny_llama

    other = {"source": "hf", "path": str(save_tiny_llama(tmp_path / "other", seed=3))}
    blob = weights_to_bytes(build_model(ModelSpec(**other)))
    paths = []  # written before generating: the swap must come while the samples are still running
    for i, bucket in enumerate(to_buckets(load_tensors(blob), 64 << 10)):
        paths.append(tmp_path / f"bucket-{i}.safetensors")
        paths[-1].write_bytes(bucket)
    prompt = prompts_of(async_engine, "Tell me a long story")[0]
    before = async_engine.tokens_generated
    future = async_engine.submit(prompt, 6, SamplingParams(max_new_tokens=400))
    wait_for(lambda: async_engine.tokens_generated - before >= 30, what="a few tokens each", every=0.01)
    if load == "blob":
        swapper = threading.Thread(target=lambda: async_engine.load_weights(blob, version=7))
    else:
        swapper = threading.Thread(target=lambda: async_engine.load_weight_files(paths, version=7))
    swapper.start()
    swapper.join(timeout=60)
    try:
        samples = future.result(timeout=120)
    finally:
        async_engine.load_weights(original, version=0)
    spanning = [s for s in samples if 0 in s.versions and 7 in s.versions]
    assert spanning, [len(s.tokens) for s in samples]
    for s in samples:  # versions run 0...0 7...7, one per token
        assert len(s.versions) == len(s.tokens) == len(s.logprobs) and s.versions == sorted(s.versions)
    rows = [(prompt, s.tokens) for s in samples]
    old, new = trainer_logprobs(fields(spec), 1.0, rows), trainer_logprobs(other, 1.0, rows)
    for s, lp_old, lp_new in zip(samples, old, new):
        expected = [a if v == 0 else b for v, a, b in zip(s.versions, lp_old, lp_new)]
        assert max(abs(a - b) for a, b in zip(s.logprobs, expected)) <= TOLERANCE
    # The other weights' numbers are not the first's: a token labelled with the wrong version would fail.
    assert max(abs(a - b) for s, lp in zip(samples, old) for a, b, v in zip(s.logprobs, lp, s.versions)
               if v == 7) > 0.1
    print(f"pause per swap ({load}): {1000 * async_engine.swap_pauses[-2]:.1f} ms; "
          f"{len(spanning)}/6 samples spanned it")


def test_drain_lets_the_in_flight_samples_finish_on_the_old_weights(async_engine, spec, original, tmp_path):
    from tests.vllm.tiny_llama import save_tiny_llama

    other = {"source": "hf", "path": str(save_tiny_llama(tmp_path / "other", seed=4))}
    prompt = prompts_of(async_engine, "Tell me a long story")[0]
    before = async_engine.tokens_generated
    async_engine.policy = "drain"  # the in_flight_updates option, switched on the module's engine
    try:
        future = async_engine.submit(prompt, 6, SamplingParams(max_new_tokens=400))
        wait_for(lambda: async_engine.tokens_generated - before >= 30, what="a few tokens each", every=0.01)
        blob = weights_to_bytes(build_model(ModelSpec(**other)))
        done_at_swap = []  # drain: the load returns only once the group in flight has finished
        swapper = threading.Thread(target=lambda: (async_engine.load_weights(blob, version=9),
                                                   done_at_swap.append(future.done())))
        swapper.start()
        samples = future.result(timeout=120)
        swapper.join(timeout=60)
        after = async_engine.generate([prompt], 1, SamplingParams(max_new_tokens=4))[0][0]
    finally:
        async_engine.policy = "resubmit"
        async_engine.load_weights(original, version=0)
    assert all(s.versions == [0] * len(s.tokens) for s in samples)  # nothing of version 9 in them
    # (How long the answers run is the random model's: an early EOS may end them all before the swap.)
    assert done_at_swap == [True] and after.versions == [9] * len(after.tokens)
    rows = [(prompt, s.tokens) for s in samples]
    assert worst_gap([samples], [prompt], lambda _: trainer_logprobs(fields(spec), 1.0, rows)) <= TOLERANCE


# ---- the rollout worker with continuous batching (rollout/continuous.py) ----

TASKS, GROUP = 120, 2  # enough that a version published mid-run lands with groups in flight


def committed_offsets(kafka, topics: Topics, group: str) -> dict[int, int]:
    """The rollout group's committed offset per tasks partition (0: none)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(**kafka.kafka_python(), group_id=group, enable_auto_commit=False)
    try:
        parts = consumer.partitions_for_topic(topics.tasks)
        return {p: consumer.committed(TopicPartition(topics.tasks, p)) or 0 for p in parts}
    finally:
        consumer.close()


@pytest.mark.broker
def test_a_continuous_worker_killed_mid_stream_loses_nothing_and_repeats_nothing_committed(
        async_engine, spec, original, kafka, namespace, tmp_path, monkeypatch):
    """The vllm_async rollout worker (rollout/continuous.py) SIGKILLed mid-stream in a process of its
    own, then restarted here on the module's engine: no task lost, none committed before the kill
    published again (those after it may be: their ids are deterministic, the trainer's dedupe trains
    each once), every committed task's group complete on the topic at the kill. A version published
    while the restarted worker generates is swapped in mid-run, its tokens labelled with it."""
    import os
    import signal
    import subprocess
    import sys
    from collections import Counter

    import undertow.rollout.worker as rollout_worker
    from undertow.rollout.worker import RolloutWorker

    rollout = {"engine": {"name": "vllm_async", "max_model_len": 512, "seed": 0, "max_inflight": 64},
               "sampling": {"max_new_tokens": 128}, "reward": "numeric_match",
               "max_staleness": 1,  # 0 would hold new tasks back from v1's announcement and drain the engine
               "max_inflight": 8}  # 4 groups of 2 in the engine at once: the run lasts seconds
    path = write_config(tmp_path / "run.yaml", namespace, model=fields(spec), rollout=rollout)
    from undertow.rollout.config import rollout_group

    topics, group = Topics(namespace), rollout_group(namespace)
    where = {}  # task id -> (partition, offset)
    with RecordProducer(kafka) as producer:
        for i in range(TASKS):
            task = Task(task_id=f"c{i}", prompt=f"What is {i}+{i % 7}?", answer=str(i + i % 7), group_size=GROUP)
            meta = producer.send(topics.tasks, task, key=task.task_id).get(timeout=30)
            where[task.task_id] = (meta.partition, meta.offset)

    root = Path(__file__).parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "tests.vllm.continuous_worker", str(path), "w-killed"], cwd=root,
                            start_new_session=True)  # its own process group: vLLM's engine core dies with it
    try:  # killed once its first commit is in: mid-stream, with groups in the engine
        wait_for(lambda: sum(committed_offsets(kafka, topics, group).values()) > 0, timeout=300,
                 what="a first commit from the first worker", proc=proc, every=0.1)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the worker and its engine core: no close, no last commit
        proc.wait()
    at_kill = committed_offsets(kafka, topics, group)
    before = Counter(e.experience_id for e in read_all(kafka, topics.raw, Experience))
    assert 0 < sum(at_kill.values()) < TASKS, at_kill  # killed mid-stream: some committed, not all

    monkeypatch.setattr(rollout_worker, "build_engine", lambda entry, model: async_engine)  # no second start-up
    config, context = load_run(path, kafka)
    worker = RolloutWorker(config.rollout, context, "w-restarted")
    assert worker.continuous  # the engine said so, not its name
    done = {}
    thread = threading.Thread(target=lambda: done.update(
        stats=worker.run(max_tasks=TASKS - sum(at_kill.values()), idle_timeout=30)), daemon=True)
    thread.start()
    wait_for(lambda: worker.stats.tasks >= 2, timeout=120, what="the restarted worker's first groups", every=0.05)
    with RecordProducer(kafka) as producer:  # v1 (the same weights: only the labels change)
        for c in chunk_weights(spec.name, 1, original, 64 << 10):
            producer.send(topics.weights, c, key=spec.name)
    thread.join(timeout=120)
    stats = done["stats"]

    published = Counter(e.experience_id for e in read_all(kafka, topics.raw, Experience))
    expected = {f"c{i}/{j}" for i in range(TASKS) for j in range(GROUP)}
    assert set(published) == expected, f"lost: {sorted(expected - set(published))[:5]}"
    assert sum(committed_offsets(kafka, topics, group).values()) == TASKS
    # Published again: only groups of tasks the kill left uncommitted (read again by the new worker).
    again = {i.rsplit("/", 1)[0] for i, n in published.items() if n > 1}
    for task_id in again:
        partition, offset = where[task_id]
        assert offset >= at_kill[partition], f"{task_id} was committed before the kill yet published again"
    # Every committed task's group was complete on the topic at the kill: its offset moved only after.
    for task_id, (partition, offset) in where.items():
        if offset < at_kill[partition]:
            assert all(before[f"{task_id}/{j}"] == 1 for j in range(GROUP)), task_id
    assert stats.tasks == TASKS - sum(at_kill.values()) and stats.weight_swaps == 1
    exps = read_all(kafka, topics.raw, Experience)
    # The swap named its version inside the engine's pause (engine.at_version): tokens after it carry
    # v1 (without that the engine's version stays 0). A sample spanning it needs a group in flight at
    # that instant, which this tiny model's ~30-token samples rarely give; tests above pin spanning.
    assert any(1 in e.token_versions for e in exps)
    assert all(e.token_versions == sorted(e.token_versions) and e.policy_version == e.token_versions[0]
               for e in exps if e.token_versions)
    spanning = [e for e in exps if set(e.token_versions) == {0, 1}]
    busy = [m.values for m in read_all(kafka, topics.metrics) if m.component == "w-restarted" and "generate_s" in m.values]
    assert busy and all(0 < v["generate_s"] < 120 for v in busy)  # the time the engine had work, counted
    print(f"{len(spanning)} samples spanned the swap; committed at the kill {at_kill}; {len(again)} groups published again; restarted worker {stats}")


@pytest.mark.broker
def test_a_continuous_worker_whose_commit_the_group_refuses_reads_its_tasks_again(
        async_engine, spec, kafka, namespace, tmp_path, monkeypatch):
    """The continuous loop stalls once past max.poll.interval (3 s here; a long broker outage ends the
    member's session alike): the group moves its partitions and refuses the commit. The worker forgets
    its commit book, rejoins at its next poll, reads those tasks again and commits every one; no group
    is lost, none missing, and it does not crash."""
    import functools
    from collections import Counter

    import undertow.rollout.worker as rollout_worker
    from undertow.rollout.config import rollout_group
    from undertow.rollout.continuous import ContinuousLoop
    from undertow.rollout.worker import RolloutWorker
    from undertow.streams import RecordConsumer

    tasks = 24
    rollout = {"engine": {"name": "vllm_async", "max_model_len": 512, "seed": 0, "max_inflight": 64},
               "sampling": {"max_new_tokens": 64}, "reward": "numeric_match", "max_staleness": 1, "max_inflight": 8}
    path = write_config(tmp_path / "run.yaml", namespace, model=fields(spec), rollout=rollout)
    topics = Topics(namespace)
    with RecordProducer(kafka) as producer:
        for i in range(tasks):
            producer.send(topics.tasks, Task(task_id=f"r{i}", prompt=f"What is {i}+1?", answer=str(i + 1),
                                             group_size=GROUP), key=f"r{i}")
    monkeypatch.setattr(rollout_worker, "build_engine", lambda entry, model: async_engine)
    monkeypatch.setattr(rollout_worker, "RecordConsumer", functools.partial(RecordConsumer, max_poll_interval_ms=3_000))
    real, stalled = ContinuousLoop._commit, []

    def stalled_once(self, force):
        if not stalled and self.book.committable():
            stalled.append(self.book.pending())
            time.sleep(6)  # no poll: the group drops this member after 3 s
        return real(self, force)

    monkeypatch.setattr(ContinuousLoop, "_commit", stalled_once)
    config, context = load_run(path, kafka)
    worker = RolloutWorker(config.rollout, context, "w-refused")
    assert worker.continuous
    stats = worker.run(max_tasks=tasks, idle_timeout=30)
    assert stalled and stats.commits_refused >= 1, stats
    published = Counter(e.experience_id for e in read_all(kafka, topics.raw, Experience))
    expected = {f"r{i}/{j}" for i in range(tasks) for j in range(GROUP)}
    assert set(published) == expected, f"lost: {sorted(expected - set(published))[:5]}"
    assert max(published.values()) > 1  # the refused tasks were generated again
    assert sum(committed_offsets(kafka, topics, rollout_group(namespace)).values()) == tasks
    print(f"refused commit with {stalled[0]} tasks in the book; {sum(n > 1 for n in published.values())} "
          f"experiences published twice; {stats}")


def test_the_endpoint_submits_each_request_at_once_and_an_answer_counts_its_oldest_version(async_engine, original):
    """`undertow serve` on the continuous engine (rollout/serve/batcher.py's submit path): six agents
    asking at once through the real `openai` client go into the engine as they come (six submits, no
    batching window) and each greedy answer is the one it gets alone; an answer whose tokens span a
    weight swap is counted at its oldest version (the session's staleness), not the newer one."""
    import openai
    from starlette.testclient import TestClient

    from undertow.rollout.serve.app import build_app
    from undertow.rollout.serve.config import ServeConfig
    from undertow.rollout.serve.endpoint import Endpoint

    endpoint = Endpoint(async_engine, "policy", SamplingParams(max_new_tokens=12), settings=ServeConfig(max_batch=8))
    agent = openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=TestClient(build_app(endpoint)),
                          max_retries=0)
    questions = [[{"role": "user", "content": f"Say {word} twice"}] for word in ("one", "two", "tree", "a b", "ok", "x")]

    def answer(messages) -> str:
        return agent.chat.completions.create(model="policy", messages=messages, temperature=0).choices[0].message.content

    together: dict[int, str] = {}
    start = threading.Barrier(len(questions))

    def at_once(i: int) -> None:
        start.wait()
        together[i] = answer(questions[i])

    threads = [threading.Thread(target=at_once, args=(i,)) for i in range(len(questions))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert endpoint.batcher.stats.calls == endpoint.batcher.stats.requests == len(questions) == len(together)
    alone = [answer(q) for q in questions]
    assert [together[i] for i in range(len(questions))] == alone
    assert len(set(alone)) > 1  # the same engine on both sides: the prompts really lead to different answers

    prompt = prompts_of(async_engine, "Tell me a long story")[0]
    held = async_engine.version  # whatever the module's earlier tests left
    before = async_engine.tokens_generated
    result: dict = {}
    asking = threading.Thread(target=lambda: result.update(
        answer=endpoint.batcher.generate(prompt, 6, SamplingParams(max_new_tokens=400))))
    asking.start()
    try:
        wait_for(lambda: async_engine.tokens_generated - before >= 30 or result, what="a few tokens each", every=0.01)
        assert not result, [len(s.tokens) for s in result["answer"].samples]
        async_engine.load_weights(original, version=held + 7)  # the same weights, a new version: tokens go on
        asking.join(timeout=120)
        versions = [set(s.versions) for s in result["answer"].samples]
        assert {held, held + 7} in versions and result["answer"].version == held, versions
    finally:
        async_engine.load_weights(original, version=held)
        endpoint.close()
