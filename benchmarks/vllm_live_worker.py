"""Rollout tokens/s in a live worker as a fraction of the engine's standalone throughput.

    ~/.cache/undertow/vllm-venv/bin/python benchmarks/vllm_live_worker.py [--model smollm2|tiny]
        [--tasks 48] [--n 4] [--new-tokens 64] [--inflight 32]

One `vllm_async` engine serves both runs, on the same prompts (the single_turn workflow's tokens
of the same tasks), n samples each, temperature 1:
- standalone: `engine.submit` kept at `--inflight` sequences, a new group the moment one returns;
- live: a RolloutWorker (continuous loop, rollout/continuous.py) on a broker ($UNDERTOW_BOOTSTRAP,
  else one started here), its tasks published once it is idle in its group; timed from the
  publish to the last experience's `generated` stamp, so it pays for reading tasks, rewards,
  encoding, publishing and committing, everything but the group join.
Printed: tokens/s of each and the ratio (target >= 0.9, issue 32), with `uptime`'s load.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere
sys.path.insert(0, str(ROOT / "benchmarks"))


def tasks_of(count: int, n: int):
    from undertow.schemas import Task

    return [Task(task_id=f"b{i}", prompt=f"What is {i} + {2 * i + 3}?", answer=str(3 * i + 3), group_size=n)
            for i in range(count)]


def standalone(engine, rows: list[list[int]], n: int, params, inflight: int) -> tuple[int, float]:
    pending, queue, tokens = set(), list(rows), 0
    started = time.perf_counter()
    while queue or pending:
        while queue and len(pending) * n < inflight:
            pending.add(engine.submit(queue.pop(0), n, params))
        done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
        tokens += sum(len(s.tokens) for f in done for s in f.result())
    return tokens, time.perf_counter() - started


def live(engine, spec, tasks, args, kafka) -> tuple[int, float]:
    import undertow.rollout.worker as rollout_worker
    from undertow.rollout.config import RolloutConfig
    from undertow.rollout.worker import RolloutWorker
    from undertow.schemas import Experience
    from undertow.streams import RecordProducer, RunContext, Topics, create_topics
    from tests.helpers import read_all

    namespace = f"bench-live-{uuid.uuid4().hex[:6]}"
    create_topics(kafka, namespace)
    rollout_worker.build_engine = lambda entry, model: engine  # the standalone run's engine, already warm
    cfg = RolloutConfig(engine={"name": "vllm_async"}, reward="numeric_match", max_inflight=args.inflight,
                        max_staleness=0, sampling={"max_new_tokens": args.new_tokens})
    worker = RolloutWorker(cfg, RunContext(namespace=namespace, kafka=kafka, model=spec), "bench")
    done = {}
    thread = threading.Thread(target=lambda: done.update(stats=worker.run(max_tasks=len(tasks))), daemon=True)
    thread.start()
    while not worker.consumer._consumer.assignment():  # joined its group: publish now
        time.sleep(0.2)
    time.sleep(1.0)
    topics = Topics(namespace)
    with RecordProducer(kafka) as producer:
        published = time.time()
        for t in tasks:
            producer.send(topics.tasks, t, key=t.task_id)
    thread.join()
    exps = read_all(kafka, topics.raw, Experience)
    assert len(exps) == len(tasks) * args.n, (len(exps), done)
    last = max(e.timestamps["generated"] for e in exps)
    return sum(e.num_response_tokens for e in exps), last - published


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--tasks", type=int, default=48)
    parser.add_argument("--n", type=int, default=4, help="samples per task (a group)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--inflight", type=int, default=32, help="sequences in the engine (rollout.max_inflight)")
    args = parser.parse_args()
    from broker import benchmark_cluster
    from vllm_inflight import model_spec

    from undertow.rollout.engines import SamplingParams, build_engine
    from undertow.rollout.rewards import build_reward
    from undertow.rollout.workflows import WorkflowContext
    from undertow.rollout.workflows.base import prompt_tokens

    with tempfile.TemporaryDirectory() as folder:
        spec = model_spec(args.model, Path(folder))
        engine = build_engine({"name": "vllm_async", "seed": 0, "max_model_len": 512,
                               "max_inflight": max(args.inflight, 8)}, spec)
        params = SamplingParams(max_new_tokens=args.new_tokens)
        tasks = tasks_of(args.tasks, args.n)
        ctx = WorkflowContext(engine=engine, sampling=params, reward=build_reward("numeric_match"))
        rows = [prompt_tokens(t, ctx)[1] for t in tasks]
        engine.generate(rows[:2], 2, SamplingParams(max_new_tokens=4))  # warm-up
        try:
            alone = standalone(engine, rows, args.n, params, args.inflight)
            with benchmark_cluster(Path(folder)) as kafka:
                worker = live(engine, spec, tasks, args, kafka)
        finally:
            engine.close()
    load = os.getloadavg()
    for name, (tokens, seconds) in (("standalone", alone), ("live worker", worker)):
        print(f"{name:>12}: {tokens} tokens in {seconds:.1f} s = {tokens / seconds:.0f} tokens/s")
    print(f"live / standalone tokens/s: {(worker[0] / worker[1]) / (alone[0] / alone[1]):.2f} "
          f"(load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f})")


if __name__ == "__main__":
    main()
