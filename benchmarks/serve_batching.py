"""`undertow serve` under concurrent agents vs one request at a time: requests/s and engine batch occupancy.

    OMP_NUM_THREADS=1 python benchmarks/serve_batching.py [--agents 16] [--requests 4] [--tokens 16]

The tiny model behind the endpoint (its HTTP app, in process) answers `--agents` x `--requests`
chat completions of `--tokens` tokens each, twice with the same engine: every agent in its own
thread (the batcher gathers what arrives while the engine is busy into one engine call), then all
from one thread (one engine call per request). Occupancy = mean requests per engine call / the
endpoint's `serve.max_batch` (set to --agents). Prints both arms, their ratio, and `uptime`'s load.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere

from starlette.testclient import TestClient  # noqa: E402

from undertow.kernel.models import ModelSpec  # noqa: E402
from undertow.rollout.engines import SamplingParams  # noqa: E402
from undertow.rollout.engines.transformers_engine import TransformersEngine  # noqa: E402
from undertow.rollout.serve.app import build_app  # noqa: E402
from undertow.rollout.serve.config import ServeConfig  # noqa: E402
from undertow.rollout.serve.endpoint import Endpoint  # noqa: E402


def arm(endpoint: Endpoint, client: TestClient, agents: int, requests: int, concurrent: bool) -> dict[str, float]:
    before = (endpoint.batcher.stats.calls, endpoint.batcher.stats.requests)

    def agent(i: int) -> None:
        for k in range(requests):
            body = {"model": "policy", "messages": [{"role": "user", "content": f"{i} {k}?"}]}
            assert client.post("/v1/chat/completions", json=body).status_code == 200

    start = time.perf_counter()
    if concurrent:
        threads = [threading.Thread(target=agent, args=(i,)) for i in range(agents)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for i in range(agents):
            agent(i)
    seconds = time.perf_counter() - start
    calls = endpoint.batcher.stats.calls - before[0]
    asked = endpoint.batcher.stats.requests - before[1]
    return {"requests_per_s": asked / seconds, "engine_calls": calls,
            "occupancy": asked / (calls * endpoint.settings.max_batch), "seconds": seconds}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    engine = TransformersEngine(ModelSpec(), batch_size=args.agents, seed=0)
    endpoint = Endpoint(engine, "policy", SamplingParams(max_new_tokens=args.tokens),
                        settings=ServeConfig(max_batch=args.agents))
    client = TestClient(build_app(endpoint))
    arm(endpoint, client, 2, 1, True)  # warm-up
    results = {}
    for name, concurrent in (("concurrent", True), ("serial", False)):
        result = results[name] = arm(endpoint, client, args.agents, args.requests, concurrent)
        print(f"{name:10s} {result['requests_per_s']:7.2f} req/s  engine calls {result['engine_calls']:3d}  "
              f"occupancy {result['occupancy']:.2f}  ({result['seconds']:.1f} s)", flush=True)
    print(f"speed-up {results['concurrent']['requests_per_s'] / results['serial']['requests_per_s']:.2f}x; "
          f"load: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    endpoint.close()


if __name__ == "__main__":
    main()
