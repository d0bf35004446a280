"""The chaos soak's short version (benchmarks/chaos_soak.py): the processor worker SIGKILLed five
times in about a minute, the single broker down for 120 s from the second kill on, poison on the raw
topic, RL from the demo's warm-up. Every component waits for the broker, and a processor restarted
meanwhile bootstraps into the outage: once it crashed there, its 30-s bootstrap timing out while
kafka-python backed off (up to 30 s) with the broker already back (streams/connect.py now tries again).
The run must finish under the default restart policy with nothing lost, nothing trained twice and no
task missing. Before the outage was waited out it lost 8 experiences (kafka-python's 120 s delivery
timeout) and the feeder and the archive crashed 3 times each."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.broker, pytest.mark.cluster, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(1500)
def test_five_kills_of_the_processors_and_a_two_minute_broker_outage_lose_nothing(demo_warm_start, tmp_path):
    figures = tmp_path / "soak.json"
    cmd = [sys.executable, "benchmarks/chaos_soak.py", "--minutes", "4", "--components", "processors",
           "--kills", "5", "--kill-every-s", "10", "15", "--brokers", "1", "--broker-every-s", "25",
           "--broker-down-s", "120", "--broker-bounces", "1", "--damage-checkpoint-at", "-1", "--default-policy",
           "--workdir", str(tmp_path / "w"),
           "--init-from", str(demo_warm_start), "--json", str(figures)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1400)
    print(proc.stdout[-3000:])
    assert figures.exists(), f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{run_log(tmp_path)}"
    result = json.loads(figures.read_text())
    assert result["run_status"] == "done", f"{result}\n{run_log(tmp_path)}"  # 5 crashes fit the default policy
    assert result["kills"] == {"processors": 5} and result["broker_kills"] == 1
    assert result["restarts"].get("processors", 0) >= 5
    assert result["lost"] == 0 and result["trained_twice"] == 0, result
    assert result["tasks_missing"] == 0 and result["tasks_published_twice"] == 0, result
    assert result["poison_sent"] > 0 and result["raw_not_experiences"] >= result["poison_sent"]
    assert result["trained"] >= 0.6 * result["published"], result
    assert proc.returncode == 0
    processors = next((tmp_path / "w" / "runs").glob("*/logs/*-rl/processors.log")).read_text()
    assert re.search(r"no broker answered at \S+ in time; waiting for one", processors)  # restarted into the outage


def run_log(tmp_path: Path) -> str:
    out = tmp_path / "w" / "run.out"
    return out.read_text()[-3000:] if out.exists() else ""
