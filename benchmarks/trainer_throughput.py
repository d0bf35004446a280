"""Training tokens/s through the DeepSpeed engine on this machine (no Kafka), each group's prompt run
once (trainer/objectives/shared_prefix.py) against every row run whole, in the same process.

    python benchmarks/trainer_throughput.py [--zero-stage 0] [--groups 8] [--steps 20]
    python benchmarks/trainer_throughput.py --config examples/smollm2_arithmetic_vllm.yaml \
        --system-len 30 --prompt-len 15 --response-len 11 --steps 3    # the SmolLM2 arithmetic run's step
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from undertow.infra.run.config import load_component_config  # noqa: E402
from undertow.kernel.models import ModelSpec  # noqa: E402
from undertow.trainer.objectives import shared_prefix  # noqa: E402
from undertow.schemas import Experience  # noqa: E402
from undertow.trainer.config import AlgorithmConfig, EngineConfig  # noqa: E402
from undertow.trainer.engine import build_training_engine, setup_process  # noqa: E402
from undertow.trainer.objectives import objectives  # noqa: E402
from undertow.trainer.step import StepShape, train_step  # noqa: E402


def experiences(groups: int, size: int, system_len: int, prompt_len: int, response_len: int) -> list[Experience]:
    """Groups of `size` answers (lengths response_len/3 .. response_len) to prompts that begin with
    the same `system_len` tokens and go on with `prompt_len` of their own."""
    out = []
    for g in range(groups):
        prompt = [5 + t % 60 for t in range(system_len)] + [5 + (g + t) % 60 for t in range(prompt_len)]
        for i in range(size):
            n = max(1, response_len // 3 + i * (response_len - response_len // 3) // max(1, size - 1))
            out.append(Experience(experience_id=f"g{g}/{i}", task_id=f"g{g}", group_id=f"g{g}", group_size=size,
                                  sample_index=i, prompt_tokens=prompt, response_tokens=[5 + (i + t) % 60 for t in range(n)],
                                  behaviour_logprobs=[-4.0] * n, advantages=[1.0 - 2 * (i % 2)] * n,
                                  policy_version=0, finish_reason="stop"))
    return out


def seconds_per_step(engine, rl, batch, process, shape: StepShape, steps: int) -> tuple[float, float]:
    """(seconds per step, trained tokens per step) after one warm-up step."""
    train_step(engine, rl, batch, None, process, pad_id=0, shape=shape)
    started = time.perf_counter()
    tokens = sum(train_step(engine, rl, batch, None, process, pad_id=0, shape=shape).metrics["tokens"]
                 for _ in range(steps))
    return (time.perf_counter() - started) / steps, tokens / steps


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", help="a run config whose model and micro_batch_tokens to train (default: the tiny model)")
    ap.add_argument("--zero-stage", type=int, default=0)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--system-len", type=int, default=0, help="tokens every prompt starts with (a system turn)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--response-len", type=int, default=96)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    run = load_component_config(args.config) if args.config else None
    spec = run.model if run else ModelSpec()
    shape = StepShape(micro_batch_tokens=run.trainer.micro_batch_tokens) if run else StepShape()
    cfg = EngineConfig(zero_stage=args.zero_stage)
    process = setup_process(cfg.master_port)
    engine = build_training_engine(spec, cfg, process)
    rl = objectives.get("rl")(AlgorithmConfig())
    batch = experiences(args.groups, args.group_size, args.system_len, args.prompt_len, args.response_len)
    shared_s, tokens = seconds_per_step(engine, rl, batch, process, shape, args.steps)
    shared_prefix.MIN_PREFIX = 1 << 30  # the reference: every row run whole
    whole_s, _ = seconds_per_step(engine, rl, batch, process, shape, args.steps)
    name = spec.name if run else "tiny model"
    print(f"{name}, ZeRO {args.zero_stage}, {args.groups} groups x {args.group_size}, prompt "
          f"{args.system_len}+{args.prompt_len} tokens, answers {max(1, args.response_len // 3)}-{args.response_len}, "
          f"micro-batches of {shape.micro_batch_tokens or 'all'} tokens:")
    print(f"  prompt once per group: {shared_s * 1000:,.0f} ms/step, {tokens / shared_s:,.0f} training tokens/s")
    print(f"  every row whole:       {whole_s * 1000:,.0f} ms/step, {tokens / whole_s:,.0f} training tokens/s")
    print(f"  speed-up {whole_s / shared_s:.2f}x")


if __name__ == "__main__":
    main()
