"""Re-running a different processor pipeline over archived raw experiences makes the expected new ready records."""

from __future__ import annotations

from pathlib import Path

import pytest

from undertow.streams import RunContext, Topics
from undertow.streams.archive import ArchiveConfig, Archiver
from undertow.streams.history import History

from tests.helpers import cli, produce, start_cli, write_config

from .helpers import REWARDS, make_group

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def test_replayed_raw_experiences_go_through_new_processors(kafka, namespace, tmp_path: Path):
    root = tmp_path / "archive"
    produce(kafka, Topics(namespace).raw, [e for g in range(3) for e in make_group(g)])
    Archiver(ArchiveConfig(root=str(root), topics=["experiences.raw"]), RunContext(namespace=namespace, kafka=kafka)).run(lambda: False, max_records=12)

    target = f"{namespace}-rloo"
    sent = cli("replay", "--root", str(root), "-n", namespace, "--view", "raw", "--into", "raw",
               "--shape", "unprocessed", "--to", target).stdout
    assert "replayed 12 records" in sent
    config = write_config(tmp_path / f"{target}.yaml", target, processors={
        "pipeline": ["clean", {"name": "reshape", "advantage": "rloo"}], "app_id": f"proc-{target}"})
    proc = start_cli("process", str(config), "--idle-exit", "4")
    out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-5000:]

    rows = History.from_topics(kafka, target).query(
        "SELECT experience_id, sample_index, advantages[1] AS a, len(advantages) = len(response_tokens) AS full "
        "FROM experiences ORDER BY experience_id").to_pylist()
    # RLOO (Ahmadian et al. 2024): A_i = r_i − mean of the others = (G·r_i − Σr) / (G − 1); Σr = 1.75, G = 4
    expected = [0.75, -1.75 / 3, 0.25 / 3, -0.75 / 3]
    assert [r["experience_id"] for r in rows] == [f"g-{g}/{i}" for g in range(3) for i in range(len(REWARDS))]
    assert all(r["full"] for r in rows)
    assert [r["a"] for r in rows] == pytest.approx(expected * 3, abs=1e-6)
