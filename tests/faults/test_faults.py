"""Fault injection: the demo loop on a 3-broker KRaft cluster survives a SIGKILL of each part in turn.

One RL run from the demo's SFT warm-up on a finite taskset (the stage ends once the trainer has
drained everything) SIGKILLs the rollout worker, the trainer and the processors (each its whole
process group, as if its machine died), one after another with the run recovering in between, then
kills one broker and brings it back. The experience log is then checked against the trainer's ledger
(tests/audit.py): every experience id published is trained exactly once or sits in the rejected
topic with a reason — none lost, none trained twice —, every task of the taskset reached the raw
topic, and the policy kept improving through the faults.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.audit import audit
from undertow.infra.broker.local import LocalKafka, free_port_block
from undertow.infra.report.metrics_log import read_metrics
from undertow.rollout.feeder import item_key
from undertow.schemas import WeightUpdate
from undertow.streams import KafkaSettings, Topics
from tests.helpers import read_all
from tests.run_output import stop_run, undertow_run, wait_for_step, wait_run

pytestmark = [pytest.mark.broker, pytest.mark.cluster, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
TASKS = 1280  # x 8 samples = 160 trainer steps of 64: 40 after the broker is back
# (part, the trainer step it dies at): each fault waits for the run to have recovered from the last
# (30 steps trained since). The broker comes back 10 steps after its kill.
FAULTS = (("rollout", 20), ("trainer", 50), ("processors", 80), ("broker", 110))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    local = LocalKafka(tmp_path_factory.mktemp("faults"), port=free_port_block(6), nodes=3, heap="384m").start()
    yield local
    local.stop()


@pytest.mark.timeout(1200)
def test_the_loop_survives_a_sigkill_of_each_part_in_turn(cluster, demo_warm_start, tmp_path):
    namespace = "faults"
    cfg = demo(namespace=namespace, steps=None)
    cfg["model"]["init_from"] = str(demo_warm_start)
    cfg["feeder"].update(epochs=1, tasksets=[{"name": "sums", "source": {"name": "sums", "size": TASKS,
                                                                        "max_operand": 9}}])
    cfg["trainer"]["checkpoint_every"] = 10  # a killed trainer resumes from a checkpoint 0-9 steps back
    # Partial groups (a sample lost to a fault) are released within 10 + 10 s, and the stage ends
    # once the trainer had nothing for 25 s: longer than that, and than any restart plus rebalance.
    cfg["processors"]["group_timeout_s"] = 10
    cfg["trainer"]["batching"]["group_timeout_s"] = 10
    cfg["run"]["idle_timeout_s"] = 25
    # Broadcast, then files for whoever missed it: the rollout worker dies while it may be in a
    # broadcast group, and the trainer resumes from a checkpoint behind versions it wrote as files.
    cfg["trainer"]["weights"] = {"transport": "broadcast", "uri": str(tmp_path / "weights"), "bucket_bytes": 100_000}
    runs = tmp_path / "runs"
    proc = start_run(cfg, tmp_path, cluster)
    try:
        for part, step in FAULTS:
            run_dir = wait_for_step(proc, runs, step, timeout=600)
            print(f"step {step}: SIGKILL {part}", flush=True)
            if part == "broker":
                cluster.stop_node(2, kill=True)
                wait_for_step(proc, runs, step + 10, timeout=600)
                cluster.start_node(2)
            else:
                pid = int((run_dir / "logs" / "0-main" / f"{part}.pid").read_text())
                os.killpg(pid, signal.SIGKILL)
        wait_run(proc, runs, timeout=540)
    finally:
        stop_run(proc, grace=120)  # a failed test must not leave its run behind
    state = json.loads((run_dir / "run.json").read_text())
    assert state["status"] == "done"
    restarts = state["stages"][0]["restarts"]
    assert restarts == {"rollout": 1, "trainer": 1, "processors": 1}, state  # the broker's bounce crashed nothing
    assert cluster.running_nodes() == [1, 2, 3]

    books = audit(KafkaSettings(bootstrap_servers=cluster.bootstrap_servers), namespace,
                  run_dir / "checkpoints" / namespace / "ledger.jsonl")
    print(f"{books.summary()}, restarts {restarts}")
    assert len(books.published) >= TASKS * 8
    assert not books.lost, f"{len(books.lost)} experiences neither trained nor rejected, e.g. {sorted(books.lost)[:5]}"
    assert not books.twice, f"{len(books.twice)} experiences trained twice, e.g. {sorted(books.twice)[:5]}"
    assert set(books.trained) <= books.published
    assert len(books.trained) >= 0.6 * len(books.published), "most experiences should be trained, not rejected"
    # Every task of the taskset reached the raw topic, each published once.
    assert {item_key(t) for t in books.raw_task_ids} == {f"sums/{i}" for i in range(TASKS)}
    assert not books.tasks_missing and not books.tasks_twice and len(books.tasks_published) == TASKS

    rewards = [(r["version"], r["reward_mean"]) for r in read_metrics(run_dir / "metrics.jsonl")
               if r["component"] == "trainer" and "reward_mean" in r]
    before = mean([v for step, v in rewards if step <= FAULTS[0][1]])
    after = mean([v for step, v in rewards[-20:]])
    print(f"reward before the first fault {before:.3f}, last 20 steps {after:.3f}")
    assert after >= before + 0.03, f"the policy stopped improving through the faults: {before:.3f} -> {after:.3f}"
    # The evaluator rode through the faults too: it scored the start and the trainer's final weights.
    evals = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["component"] == "eval"]
    print(f"greedy accuracy {[(int(r['version']), r['sums-all/greedy_accuracy']) for r in evals]}")
    assert evals[0]["version"] == 0 and evals[-1]["version"] == rewards[-1][0]
    check_transport(cluster, namespace, run_dir, last=int(rewards[-1][0]))


def check_transport(cluster: LocalKafka, namespace: str, run_dir: Path, last: int) -> None:
    """The topic held announcements only, workers swapped all along, broadcast reached its members."""
    kafka = KafkaSettings(bootstrap_servers=cluster.bootstrap_servers)
    updates = read_all(kafka, Topics(namespace).weights, WeightUpdate)
    assert updates and all(u.data is None and u.transport in ("files", "broadcast") for u in updates)
    metrics = read_metrics(run_dir / "metrics.jsonl")
    swapped = sorted({int(r["step"]) for r in metrics if "weight_swap_s" in r})
    print(f"{len(swapped)} versions swapped in of {last}, pause "
          f"{max(r['weight_swap_s'] for r in metrics if 'weight_swap_s' in r):.3f} s at most")
    assert len(swapped) >= 0.5 * last and swapped[-1] >= last - 5
    rounds = [r for r in metrics if r["component"] == "trainer-weights"]
    sent = sum(r["broadcast_sent"] for r in rounds)
    print(f"broadcast: {sent:.0f} of {len(rounds)} versions sent to the group")
    assert sent >= 0.5 * len(rounds)


# -- helpers ------------------------------------------------------------------------------------


def demo(namespace: str, steps: int | None) -> dict:
    cfg = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    cfg["namespace"] = namespace
    cfg["run"].update(name=namespace, stages=[], steps=steps)
    return cfg


def start_run(cfg: dict, tmp: Path, cluster: LocalKafka) -> subprocess.Popen:
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return undertow_run(str(path), "--runs-dir", str(tmp / "runs"), env={"UNDERTOW_BOOTSTRAP": cluster.bootstrap_servers})


def mean(values: list[float]) -> float:
    assert values
    return sum(values) / len(values)
