"""Processor worker throughput with model scorers, against the same worker without one.

    python benchmarks/model_scorers.py [--records 4000] [--rm-path DIR] [--judge-path DIR] [--bootstrap host:port]

Starts its own broker unless --bootstrap (or UNDERTOW_BOOTSTRAP) names one. Each arm is one
`undertow process` worker draining its own namespace of ~1 KB experiences, each with a response of
its own (no verdict cache hits), measured between 10% and 100% of the records handled (start-up and
model loading excluded):
1. reference: clean + score with a stream score (format_bonus), no model (10 x the records: it is fast);
2. + reward_model: the tiny sequence classifier (tests/scoring_models.py) or `--rm-path`;
3. + llm_judge, local: the tiny causal LM or `--judge-path`, labels verdict (one forward pass each);
4. + llm_judge, endpoint: an OpenAI-compatible HTTP server on localhost (tests/scoring_models.py,
   answers at once: what the worker adds around the requests), labels verdict, 8 requests in flight.
Each arm is printed as records/s and as a ratio of the reference measured in the same run, beside
`uptime`'s load average: the machine is shared, compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import yaml  # noqa: E402

import processors_throughput as pt  # noqa: E402  (its rate measurement and progress counter)
from undertow.infra.broker.local import LocalKafka, free_port_block  # noqa: E402
from undertow.schemas import Experience  # noqa: E402
from undertow.streams import KafkaSettings, RecordProducer, Topics, create_topics  # noqa: E402
from tests.scoring_models import JudgeServer, judge_dir, reward_model_dir  # noqa: E402


def experiences(n: int) -> list[Experience]:
    now = time.time()
    return [Experience(experience_id=f"e{i}", task_id=f"t{i}", group_id=f"g{i}", group_size=1, sample_index=0,
                       prompt_text=f"What is {i} + 7?", prompt_tokens=list(range(16)),
                       response_text=f"{i} + 7 = {i + 7}, so the answer is {i + 7}.", response_tokens=list(range(200)),
                       reward=None, policy_version=0, finish_reason="stop", timestamps={"created": now})
            for i in range(n)]


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def arm(kafka: KafkaSettings, bootstrap: str, name: str, score: dict, records: int, workdir: Path) -> dict:
    """One worker over `records` fresh experiences with `score` as its scoring stage: records/s."""
    ns = f"bench-{''.join(c for c in name if c.isalnum() or c == '_')}-{uuid.uuid4().hex[:6]}"
    create_topics(kafka, ns)
    topics = Topics(ns)
    with RecordProducer(kafka, linger_ms=20, batch_size=1 << 20) as p:
        for e in experiences(records):
            p.send(topics.raw, e, key=e.group_id)
    config = workdir / f"{ns}.yaml"
    config.write_text(yaml.safe_dump({"namespace": ns, "kafka": {"bootstrap_servers": bootstrap},
                                      "processors": {"pipeline": ["clean", score], "metrics_every_s": 5.0}}))
    log = config.with_suffix(".log")
    with open(log, "w") as out:
        worker = subprocess.Popen([sys.executable, "-m", "undertow.infra.cli", "process", str(config)], cwd=ROOT,
                                  stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    progress = pt.Progress(kafka, [topics.ready, topics.rejected])
    try:
        result = pt.throughput(progress, worker.pid, lambda: worker.poll() is None, records)
    except RuntimeError as e:
        raise RuntimeError(f"{name}: {e}; the worker's log ends:\n{log.read_text()[-3000:]}") from None
    finally:
        progress.close()
        pt.shut_down(worker, None)
    return {**result, "records": records, "load": uptime().split("load average:")[-1].strip()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=4000, help="experiences per scorer arm (the reference: 10 x)")
    ap.add_argument("--rm-path", help="a sequence-classification model directory (default: a tiny one built here)")
    ap.add_argument("--judge-path", help="a causal LM directory for the local judge (default: a tiny one built here)")
    ap.add_argument("--bootstrap", default=os.environ.get("UNDERTOW_BOOTSTRAP"))
    args = ap.parse_args()
    workdir = Path(tempfile.mkdtemp())
    rm = args.rm_path or str(reward_model_dir(workdir / "rm"))
    judge = args.judge_path or str(judge_dir(workdir / "judge"))
    broker = None
    if not args.bootstrap:
        broker = LocalKafka(workdir / "kafka", port=free_port_block(2)).start()
        args.bootstrap = broker.bootstrap_servers
    kafka = KafkaSettings(bootstrap_servers=args.bootstrap)
    base = {"name": "score", "scores": ["format_bonus"], "batch_size": 64}
    try:
        with JudgeServer() as server:
            arms = {
                "reference (no model)": (base, 10 * args.records),
                "+ reward_model": ({**base, "scorer": {"name": "reward_model", "path": rm, "batch_size": 32}},
                                   args.records),
                "+ llm_judge, local": ({**base, "scorer": {"name": "llm_judge", "path": judge, "batch_size": 32}},
                                       args.records),
                "+ llm_judge, endpoint": ({**base, "scorer": {"name": "llm_judge", "base_url": server.base_url,
                                                             "model": "judge", "batch_size": 1, "workers": 8}},
                                          args.records),
            }
            results = {}
            for name, (score, n) in arms.items():
                results[name] = arm(kafka, args.bootstrap, name, score, n, workdir)
                print(f"{name}: {results[name]}", flush=True)
    finally:
        if broker:
            broker.stop()
    ref = results["reference (no model)"]["per_s"]
    print(f"\n{'arm':24} {'records/s':>10} {'vs reference':>13}  load average (1, 5, 15 min)")
    for name, r in results.items():
        print(f"{name:24} {r['per_s']:>10} {r['per_s'] / ref:>12.3f}x  {r['load']}")


if __name__ == "__main__":
    main()
