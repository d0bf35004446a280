"""SmolLM2-135M training on this machine: peak memory of one step in micro-batches with gradient
checkpointing against one pass, and the trainer's tokens/s against a plain torch loop.

    python benchmarks/trainer_memory.py [--rows 16] [--micro-rows 4] [--tokens 256] [--steps 2]

Each figure comes from its own process (peak RSS is a process's high-water mark):
    one pass      the trainer (DeepSpeed, ZeRO-0), the whole batch in one forward/backward
    micro + ckpt  the trainer, micro-batches of --micro-rows rows, gradient checkpointing
    plain loop    torch AdamW over the same micro-batches, same objective, same checkpointing
The default batch is 16 x 256: 64 x 256 in one pass needs about 40 GB here (logits alone are
64 x 256 x 49,152 fp32 = 3.2 GB, several times over), so it is not a reference this machine can
measure; `--rows 64` runs the micro-batched trainer alone at that size.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere


def experiences(rows: int, tokens: int):
    """Synthetic experiences of SmolLM2's vocabulary: a quarter prompt, the rest response."""
    from undertow.schemas import Experience

    prompt_len = tokens // 4
    response_len = tokens - prompt_len
    return [Experience(experience_id=f"e{i}", task_id=f"t{i // 4}", group_id=f"t{i // 4}", group_size=4,
                       sample_index=i % 4, prompt_tokens=[100 + (i * 7 + t) % 40000 for t in range(prompt_len)],
                       response_tokens=[100 + (i * 13 + t) % 40000 for t in range(response_len)],
                       behaviour_logprobs=[-9.0] * response_len, advantages=[1.0 - 2 * (i % 2)] * response_len,
                       policy_version=0, finish_reason="stop") for i in range(rows)]


def child(args: argparse.Namespace) -> dict:
    import torch

    from undertow.kernel.models import ModelSpec, build_model
    from undertow.trainer.config import AlgorithmConfig, EngineConfig
    from undertow.trainer.objectives import objectives
    from undertow.trainer.step import StepShape, plan, to_device, train_step

    torch.set_num_threads(args.threads)
    spec = ModelSpec(name="smollm2-135m", source="gguf")
    records = experiences(args.rows, args.tokens)
    rl = objectives.get("rl")(AlgorithmConfig())
    budget = args.micro_rows * args.tokens if args.micro_rows else None
    shape = StepShape(micro_batch_tokens=budget, pad_to_multiple=8)
    times = []
    if args.mode == "trainer":
        from undertow.trainer.engine import build_training_engine, setup_process

        process = setup_process()
        engine = build_training_engine(spec, EngineConfig(lr=1e-6), process, gradient_checkpointing=args.checkpointing)
        for _ in range(args.steps):
            started = time.perf_counter()
            train_step(engine, rl, records, None, process, pad_id=0, shape=shape)
            times.append(time.perf_counter() - started)
    else:
        model = build_model(spec).train()
        if args.checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        device = torch.device("cpu")
        for _ in range(args.steps):
            started = time.perf_counter()
            (update,) = plan(records, rl, shape, 0, 1)
            for micro in update.micro:
                batch = to_device(rl.collate(micro, pad_id=0, pad_to_multiple=8), device)
                rl.loss(model, batch, None, update.totals).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            times.append(time.perf_counter() - started)
    tokens = sum(len(r.prompt_tokens) + len(r.response_tokens) for r in records)
    steady = times[1:] or times  # the first step allocates the optimizer state
    return {"peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,
            "tokens_per_s": tokens / (sum(steady) / len(steady)), "step_s": times}


def measure(label: str, mode: str, args: argparse.Namespace, micro_rows: int, checkpointing: bool) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--rows", str(args.rows), "--tokens", str(args.tokens),
           "--micro-rows", str(micro_rows), "--steps", str(args.steps), "--threads", str(args.threads),
           *(["--checkpointing"] if checkpointing else [])]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    if done.returncode != 0:
        raise SystemExit(f"{label} failed:\n{done.stderr[-4000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{label:>13}: peak RSS {result['peak_rss_gb']:.2f} GB, {result['tokens_per_s']:,.0f} tokens/s "
          f"(steps {', '.join(f'{s:.1f}' for s in result['step_s'])} s)", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--micro-rows", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256, help="prompt + response tokens per row")
    ap.add_argument("--steps", type=int, default=2, help="steps per measurement (the first is warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", choices=["trainer", "plain"])
    ap.add_argument("--checkpointing", action="store_true")
    args = ap.parse_args()
    if args.child:
        args.mode = args.child
        print(json.dumps(child(args)))
        return
    print(f"SmolLM2-135M, {args.rows} x {args.tokens} tokens a step, micro-batches of {args.micro_rows} rows, "
          f"{args.threads} threads")
    micro = measure("micro + ckpt", "trainer", args, args.micro_rows, True)
    if args.rows > 16:
        return
    whole = measure("one pass", "trainer", args, 0, False)
    plain = measure("plain loop", "plain", args, args.micro_rows, True)
    print(f"peak RSS, micro-batched + checkpointing / one pass: {micro['peak_rss_gb'] / whole['peak_rss_gb']:.2f}x "
          f"(target <= 0.5x)")
    print(f"tokens/s, trainer / plain torch loop (same micro-batches): "
          f"{micro['tokens_per_s'] / plain['tokens_per_s']:.2f}x (target >= 0.9x)")


if __name__ == "__main__":
    main()
