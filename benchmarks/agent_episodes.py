"""Multi-turn episodes played at once vs one at a time: episodes/s and engine batch occupancy.

    OMP_NUM_THREADS=1 python benchmarks/agent_episodes.py [--tasks 8] [--group 4] [--turns 4]

The tiny model plays frozen_lake (multi_turn) on `--tasks` tasks of `--group` episodes each, twice
with the same engine, seeds and budgets: every episode of the batch at once (one engine call per
turn over the live episodes, as the worker runs them), then episode by episode (the former serial
loop). Occupancy = mean sequences per generate call / the engine's batch size. Arms alternate for
`--repeats`; prints each arm's episodes/s and occupancy, their ratio, and `uptime`'s load.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import torch  # noqa: E402

from undertow.kernel.models import ModelSpec  # noqa: E402
from undertow.rollout.engines import SamplingParams, build_engine  # noqa: E402
from undertow.rollout.rewards import build_reward  # noqa: E402
from undertow.rollout.workflows import WorkflowContext, build_batch_workflow  # noqa: E402
from undertow.schemas import Task  # noqa: E402


class Counting:
    """The engine, with the size of each generate call counted."""

    def __init__(self, engine):
        self.engine, self.tokenizer, self.max_length = engine, engine.tokenizer, engine.max_length
        self.sizes: list[int] = []

    def generate(self, prompts, n, params):
        self.sizes.append(len(prompts) * n)
        return self.engine.generate(prompts, n, params)

    def logprobs(self, prompt, continuation, temperature):
        return self.engine.logprobs(prompt, continuation, temperature)


def arm(engine: Counting, tasks: list[Task], ctx: WorkflowContext, flow, together: bool) -> tuple[float, float]:
    """Episodes/s and occupancy of one pass over `tasks`."""
    engine.sizes.clear()
    torch.manual_seed(0)
    started = time.perf_counter()
    if together:
        outcomes = flow(tasks, ctx)
    else:  # one episode at a time: a task of group_size 1 per sample
        outcomes = [flow([t.model_copy(update={"group_size": 1})], ctx)[0] for t in tasks for _ in range(t.group_size)]
    seconds = time.perf_counter() - started
    assert not any(isinstance(o, Exception) for o in outcomes), outcomes
    episodes = sum(t.group_size for t in tasks)
    return episodes / seconds, sum(engine.sizes) / len(engine.sizes) / engine.engine.batch_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--new-tokens", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    batch = args.tasks * args.group
    engine = Counting(build_engine({"name": "transformers", "batch_size": batch, "seed": 0}, ModelSpec()))
    ctx = WorkflowContext(engine=engine, sampling=SamplingParams(max_new_tokens=args.new_tokens),
                          reward=build_reward("format"))
    flow = build_batch_workflow({"name": "multi_turn", "max_turns": args.turns,
                                 "environment": {"name": "frozen_lake", "size": 3}})
    tasks = [Task(task_id=f"lake{i}", prompt="Walk to G.", group_size=args.group) for i in range(args.tasks)]
    arm(engine, tasks[:1], ctx, flow, True)  # warm-up
    results: dict[str, list[tuple[float, float]]] = {"together": [], "serial": []}
    for _ in range(args.repeats):
        for name in results:
            results[name].append(arm(engine, tasks, ctx, flow, name == "together"))
    best = {name: max(runs) for name, runs in results.items()}
    for name, (rate, occupancy) in best.items():
        print(f"{name:9s} {rate:7.2f} episodes/s  occupancy {occupancy:.3f} "
              f"({occupancy * batch:.1f} of {batch} sequences a call)")
    print(f"together / serial: {best['together'][0] / best['serial'][0]:.2f}x episodes/s")
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
