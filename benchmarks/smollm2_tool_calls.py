"""How often the policy of a tool_agent config calls its tool: the fraction of episodes with a
well-formed call that ran, the calls by outcome, and the mean reward, over sampled episodes.

    OMP_NUM_THREADS=2 python benchmarks/smollm2_tool_calls.py [examples/smollm2_calculator.yaml] [--tasks 4]
        [--no-examples]

Runs the config's model, engine (transformers only here), sampling, workflow and reward on the first
`--tasks` items of its first taskset, `feeder.group_size` episodes each, with no broker: what the
worker's first batch would see at version 0. `--no-examples` drops the workflow's worked examples
(the before arm). Prints the numbers and `uptime`'s load.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import torch  # noqa: E402

from undertow.infra.run.config import RunConfig  # noqa: E402
from undertow.kernel.config_io import load_yaml  # noqa: E402
from undertow.rollout.engines import build_engine  # noqa: E402
from undertow.rollout.feeder.items import load_items  # noqa: E402
from undertow.rollout.rewards import build_reward  # noqa: E402
from undertow.rollout.workflows import WorkflowContext, build_batch_workflow  # noqa: E402
from undertow.schemas import Task  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("config", nargs="?", default="examples/smollm2_calculator.yaml")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--no-examples", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    cfg = RunConfig.model_validate(load_yaml(Path(args.config)))
    workflow = dict(cfg.rollout.workflow) if isinstance(cfg.rollout.workflow, dict) else {"name": cfg.rollout.workflow}
    if args.no_examples:
        workflow.pop("examples", None)
    engine = build_engine({"name": "transformers", "seed": args.seed, "batch_size": 64}, cfg.model)
    ctx = WorkflowContext(engine=engine, sampling=cfg.rollout.sampling, reward=build_reward(cfg.rollout.reward))
    items = load_items(cfg.feeder.tasksets[0].source)[:args.tasks]
    tasks = [Task(task_id=i.key, prompt=i.prompt, messages=i.messages, answer=i.answer, created_at=time.time(),
                  group_size=cfg.feeder.group_size) for i in items]
    torch.manual_seed(args.seed)
    started = time.perf_counter()
    outcomes = build_batch_workflow(workflow)(tasks, ctx)
    seconds = time.perf_counter() - started
    episodes = [t for o in outcomes for t in o]
    kinds: dict[str, int] = {}
    for t in episodes:
        for kind, count in t.metadata.get("tools", {}).items():
            kinds[kind] = kinds.get(kind, 0) + count
    called = sum(1 for t in episodes if t.metadata.get("tools", {}).get("ok", 0) > 0)
    reward = sum(sum(t.reward_components.values()) for t in episodes) / len(episodes)
    print(f"{'without' if args.no_examples else 'with'} examples: {called}/{len(episodes)} episodes made a "
          f"well-formed call that ran ({called / len(episodes):.2f}); calls by outcome {kinds}; mean reward "
          f"{reward:.3f}; {seconds:.0f} s")
    for t in episodes[:3]:  # what the calls look like
        print(t.metadata.get("tools"), repr(t.response_text[:300]))
    print(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())


if __name__ == "__main__":
    main()
