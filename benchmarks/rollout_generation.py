"""Generation throughput of the transformers engine (tokens/s), tiny model by default.

    OMP_NUM_THREADS=1 python benchmarks/rollout_generation.py [--prompts 8] [--n 4] [--new-tokens 64]

Counts generated response tokens (EOS included) per second of wall time, scoring pass included.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

import torch  # noqa: E402

from undertow.rollout.engines import SamplingParams, build_engine  # noqa: E402
from undertow.kernel.models import ModelSpec  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--source", default="tiny", choices=["tiny", "gguf"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    engine = build_engine({"name": "transformers", "batch_size": args.batch_size, "seed": 0},
                          ModelSpec(source=args.source))
    prompts = [engine.tokenizer(f"What is {i} + {i + 3}? Answer:")["input_ids"] for i in range(args.prompts)]
    # min_new_tokens is not an engine option: a random tiny model rarely emits EOS, so runs are full length.
    params = SamplingParams(max_new_tokens=args.new_tokens)
    engine.generate(prompts[:1], 1, params)  # warm-up
    rates = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        groups = engine.generate(prompts, args.n, params)
        seconds = time.perf_counter() - start
        tokens = sum(len(s.tokens) for g in groups for s in g)
        rates.append(tokens / seconds)
        print(f"{tokens} tokens in {seconds:.2f} s: {tokens / seconds:.0f} tokens/s")
    print(f"median: {sorted(rates)[len(rates) // 2]:.0f} tokens/s "
          f"({args.prompts} prompts x {args.n} samples, batch {args.batch_size}, {args.source} model, "
          f"{torch.get_num_threads()} thread(s), device {engine.device})")


if __name__ == "__main__":
    main()
