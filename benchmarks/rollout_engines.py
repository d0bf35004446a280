"""The transformers engine against the vLLM engine on SmolLM2-135M: tokens/s, their ratio, each as a
fraction of this machine's compute bound, and the pause a weight swap costs.

    python benchmarks/rollout_engines.py [--prompts 64] [--n 8] [--new-tokens 64] [--threads 2]

Each engine runs in its own environment (transformers here, vLLM in ~/.cache/undertow/vllm-venv:
`bash infra/bootstrap.sh --vllm`), one after the other, on the same prompts. The compute bound is
measured in the same run: a float32 matmul's FLOP/s here / (2 x parameters) tokens/s.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere

MODEL = {"name": "smollm2-135m", "source": "gguf"}
ENGINES = {"transformers": {"name": "transformers", "batch_size": 128, "seed": 0},
           "vllm": {"name": "vllm", "seed": 0, "max_model_len": 512}}
RESULT = "result: "


def measure(engine_name: str, prompts: int, n: int, new_tokens: int) -> dict:
    """In the engine's environment: start-up, one timed generate() of all prompts, one timed swap."""
    import torch

    from undertow.kernel.models import ModelSpec, build_model, weights_to_bytes
    from undertow.rollout.engines import SamplingParams, build_engine

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    spec = ModelSpec(**MODEL)
    started = time.perf_counter()
    engine = build_engine(ENGINES[engine_name], spec)
    startup = time.perf_counter() - started
    tok = engine.tokenizer
    texts = [tok.apply_chat_template([{"role": "user", "content": f"What is {i} + {2 * i + 3}?"}],
                                     add_generation_prompt=True, tokenize=False) for i in range(prompts)]
    rows = [tok(t, add_special_tokens=False)["input_ids"] for t in texts]  # as rollout/workflows/base.py does
    params = SamplingParams(temperature=1.0, max_new_tokens=new_tokens)
    engine.generate(rows[:2], 2, SamplingParams(max_new_tokens=4))  # warm-up
    started = time.perf_counter()
    groups = engine.generate(rows, n, params)
    seconds = time.perf_counter() - started
    model = build_model(spec)
    blob = weights_to_bytes(model)
    started = time.perf_counter()
    engine.load_weights(blob)
    swap = time.perf_counter() - started
    return {"tokens": sum(len(s.tokens) for g in groups for s in g), "seconds": seconds, "startup_s": startup,
            "swap_s": swap, "parameters": sum(p.numel() for p in model.parameters()), "swap_mb": len(blob) / 1e6}


def matmul_flops(threads: int, size: int = 1024, repeats: int = 20) -> float:
    import torch

    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b  # warm-up
    started = time.perf_counter()
    for _ in range(repeats):
        a @ b
    return 2 * size ** 3 * repeats / (time.perf_counter() - started)


def run_child(engine: str, python: str, args: argparse.Namespace) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "--child", engine, "--prompts", str(args.prompts),
           "--n", str(args.n), "--new-tokens", str(args.new_tokens)]
    out = subprocess.run(cmd, cwd=ROOT, check=True, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": str(args.threads)})
    (line,) = [line for line in out.stdout.splitlines() if line.startswith(RESULT)]  # vLLM logs to stdout too
    return json.loads(line[len(RESULT):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=8, help="samples per prompt")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", choices=sorted(ENGINES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # inside one engine's environment: one JSON line for the parent
        print(RESULT + json.dumps(measure(args.child, args.prompts, args.n, args.new_tokens)), flush=True)
        return
    from undertow.infra.run.rollout_env import vllm_python

    results = {"transformers": run_child("transformers", sys.executable, args),
               "vllm": run_child("vllm", str(vllm_python()), args)}
    flops = matmul_flops(args.threads)
    bound = flops / (2 * results["vllm"]["parameters"])
    print(f"SmolLM2-135M fp32, {args.prompts} prompts x {args.n} samples x <= {args.new_tokens} new tokens, "
          f"{args.threads} thread(s); compute bound {flops / 1e9:.1f} GFLOP/s / (2 x "
          f"{results['vllm']['parameters'] / 1e6:.0f}M) = {bound:.0f} tokens/s")
    for name, r in results.items():
        rate = r["tokens"] / r["seconds"]
        print(f"{name:>12}: {r['tokens']} tokens in {r['seconds']:.1f} s = {rate:.0f} tokens/s "
              f"({rate / bound:.0%} of the bound); start-up {r['startup_s']:.1f} s; "
              f"swap of {r['swap_mb']:.0f} MB pauses generation {r['swap_s']:.2f} s")
    ratio = (results["vllm"]["tokens"] / results["vllm"]["seconds"]) / (
        results["transformers"]["tokens"] / results["transformers"]["seconds"])
    print(f"vllm / transformers: {ratio:.2f}x (target on CPU: >= 0.9x)")


if __name__ == "__main__":
    main()
