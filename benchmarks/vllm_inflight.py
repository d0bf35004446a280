"""Continuous batching with in-flight weight swaps against batch-at-a-time with swaps between batches.

    ~/.cache/undertow/vllm-venv/bin/python benchmarks/vllm_inflight.py [--model smollm2|tiny]
        [--prompts 32] [--n 4] [--new-tokens 64] [--inflight 8] [--swap-every 8]

Both runs generate the same groups (n samples per prompt, temperature 1, EOS ends a sample early):
- continuous: engine `vllm_async`, up to `--inflight` groups in the engine, a new one submitted the
  moment one comes back, and a thread loading whole weights every `--swap-every` seconds while
  requests are in flight (rollout.engine.in_flight_updates: resubmit);
- batch: engine `vllm`, `--inflight` prompts per `generate()`, and a swap after a batch whenever
  `--swap-every` seconds have passed since the last one (what the worker does today).
Printed: tokens/s of each and their ratio, and the pause a swap costs generation (continuous: from
the scheduler's pause to its resume; batch: the load, while nothing generates).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import gc
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script from anywhere


def model_spec(name: str, folder: Path):
    from undertow.kernel.models import ModelSpec

    if name == "smollm2":
        return ModelSpec(name="smollm2-135m", source="gguf")
    from tests.vllm.tiny_llama import save_tiny_llama

    return ModelSpec(source="hf", path=str(save_tiny_llama(folder)))


def workload(tok, prompts: int) -> list[list[int]]:
    texts = [f"What is {i} + {2 * i + 3}?" for i in range(prompts)]
    if getattr(tok, "chat_template", None):
        texts = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                         tokenize=False) for t in texts]
    return [tok(t, add_special_tokens=False)["input_ids"] for t in texts]


def two_versions(spec) -> list[bytes]:
    """The model's weights and a perturbed copy: swaps alternate between them."""
    import torch

    from undertow.kernel.models import build_model, weights_to_bytes

    model = build_model(spec)
    first = weights_to_bytes(model)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.01)
    return [first, weights_to_bytes(model)]


def continuous(spec, rows, blobs, args) -> dict:
    from undertow.rollout.engines import SamplingParams, build_engine

    engine = build_engine({"name": "vllm_async", "seed": 0, "max_model_len": 512,
                           "max_inflight": args.inflight * args.n}, spec)
    params = SamplingParams(max_new_tokens=args.new_tokens)
    engine.generate(rows[:2], 2, SamplingParams(max_new_tokens=4))  # warm-up
    stop = threading.Event()

    def swapper():
        version = 0
        while not stop.wait(args.swap_every):
            version += 1
            engine.load_weights(blobs[version % 2], version=version)

    pending, queue, tokens, spanning = set(), list(rows), 0, 0
    started = time.perf_counter()
    thread = threading.Thread(target=swapper, daemon=True)
    thread.start()
    while queue or pending:
        while queue and len(pending) < args.inflight:
            pending.add(engine.submit(queue.pop(), args.n, params))
        done, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
        for f in done:
            tokens += sum(len(s.tokens) for s in f.result())
            spanning += sum(len(set(s.versions)) > 1 for s in f.result())
    seconds = time.perf_counter() - started
    stop.set()
    thread.join()
    pauses = list(engine.swap_pauses)
    engine.close()
    return {"tokens": tokens, "seconds": seconds, "pauses": pauses, "spanning": spanning}


def batched(spec, rows, blobs, args) -> dict:
    from undertow.rollout.engines import SamplingParams, build_engine

    engine = build_engine({"name": "vllm", "seed": 0, "max_model_len": 512,
                           "max_num_seqs": args.inflight * args.n}, spec)
    params = SamplingParams(max_new_tokens=args.new_tokens)
    engine.generate(rows[:2], 2, SamplingParams(max_new_tokens=4))
    tokens, pauses, version = 0, [], 0
    started = last_swap = time.perf_counter()
    for i in range(0, len(rows), args.inflight):
        groups = engine.generate(rows[i:i + args.inflight], args.n, params)
        tokens += sum(len(s.tokens) for g in groups for s in g)
        if time.perf_counter() - last_swap >= args.swap_every:
            version += 1
            t = time.perf_counter()
            engine.load_weights(blobs[version % 2])
            last_swap = time.perf_counter()
            pauses.append(last_swap - t)
    seconds = time.perf_counter() - started
    del engine.llm
    gc.collect()
    return {"tokens": tokens, "seconds": seconds, "pauses": pauses}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=["smollm2", "tiny"], default="smollm2")
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--n", type=int, default=4, help="samples per prompt (a group)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--inflight", type=int, default=8, help="groups in the engine (continuous) = prompts "
                                                                "per batch (batch)")
    parser.add_argument("--swap-every", type=float, default=8.0, help="seconds between weight swaps")
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        spec = model_spec(args.model, Path(folder))
        blobs = two_versions(spec)
        from undertow.kernel.models import build_tokenizer

        rows = workload(build_tokenizer(spec), args.prompts)
        results = {"batch": batched(spec, rows, blobs, args), "continuous": continuous(spec, rows, blobs, args)}
    for name, r in results.items():
        pauses = r["pauses"]
        mean = 1000 * sum(pauses) / len(pauses) if pauses else float("nan")
        extra = f", {r['spanning']} samples spanned a swap" if "spanning" in r else ""
        print(f"{name:>10}: {r['tokens']} tokens in {r['seconds']:.1f} s = {r['tokens'] / r['seconds']:.0f} "
              f"tokens/s; {len(pauses)} swaps, pause per swap {mean:.0f} ms{extra}")
    rate = {k: r["tokens"] / r["seconds"] for k, r in results.items()}
    print(f"continuous / batch tokens/s: {rate['continuous'] / rate['batch']:.2f}x")


if __name__ == "__main__":
    main()
