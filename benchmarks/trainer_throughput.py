"""Training tokens/s of the tiny model through the DeepSpeed engine on this machine (no Kafka).

    python benchmarks/trainer_throughput.py [--zero-stage 0] [--groups 8] [--steps 20]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from undertow.kernel.models import ModelSpec  # noqa: E402
from undertow.schemas import Experience  # noqa: E402
from undertow.trainer.config import AlgorithmConfig, EngineConfig  # noqa: E402
from undertow.trainer.engine import build_training_engine, setup_process  # noqa: E402
from undertow.trainer.objectives import objectives  # noqa: E402
from undertow.trainer.step import train_step  # noqa: E402


def experiences(groups: int, size: int, prompt_len: int, response_len: int) -> list[Experience]:
    out = []
    for g in range(groups):
        for i in range(size):
            out.append(Experience(experience_id=f"g{g}/{i}", task_id=f"g{g}", group_id=f"g{g}", group_size=size,
                                  sample_index=i, prompt_tokens=[5 + (g + t) % 60 for t in range(prompt_len)],
                                  response_tokens=[5 + (i + t) % 60 for t in range(response_len)],
                                  behaviour_logprobs=[-4.0] * response_len, advantages=[1.0 - 2 * (i % 2)] * response_len,
                                  policy_version=0, finish_reason="stop"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--zero-stage", type=int, default=0)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--response-len", type=int, default=96)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    cfg = EngineConfig(zero_stage=args.zero_stage)
    process = setup_process(cfg.master_port)
    engine = build_training_engine(ModelSpec(), cfg, process)
    rl = objectives.get("rl")(AlgorithmConfig())
    batch = experiences(args.groups, args.group_size, args.prompt_len, args.response_len)
    train_step(engine, rl, batch, None, process, pad_id=0)  # warm-up
    started = time.perf_counter()
    tokens = sum(train_step(engine, rl, batch, None, process, pad_id=0).metrics["tokens"]
                 for _ in range(args.steps))
    seconds = time.perf_counter() - started
    print(f"tiny model, ZeRO {args.zero_stage}, batch {len(batch)} x {args.prompt_len + args.response_len} tokens: "
          f"{tokens / seconds:,.0f} training tokens/s ({seconds / args.steps * 1000:.0f} ms/step)")


if __name__ == "__main__":
    main()
