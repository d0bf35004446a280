"""Archive a recorded run from the real broker (also across a kill -9), query it, replay selections."""

from __future__ import annotations

import csv
import datetime as dt
import signal
from pathlib import Path

import pytest

from undertow.schemas import Experience, PreferencePair
from undertow.streams import RecordProducer, Topics, create_topics, record_counts
from undertow.streams.archive_store import ArchiveStore
from undertow.streams.history import History
from undertow.streams.replay import Selection, replay

from tests.helpers import cli, produce, read_all, start_cli, wait_for, write_config

from .helpers import make_group, metric

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def pair(i: int) -> PreferencePair:
    return PreferencePair(pair_id=f"p-{i}", task_id=f"t-{i}", prompt_tokens=[1], chosen_tokens=[2], rejected_tokens=[3])


def archived_offsets(history: History, view: str) -> list[tuple[int, int]]:
    rows = history.query(f"SELECT kafka_partition p, kafka_offset o FROM {view} ORDER BY 1, 2").to_pylist()
    return [(r["p"], r["o"]) for r in rows]


def test_archive_survives_kill_and_history_replays(kafka, namespace, tmp_path: Path):
    topics, root = Topics(namespace), tmp_path / "archive"
    first, second = [e for g in range(5) for e in make_group(g)], [e for g in range(5, 10) for e in make_group(g)]
    produce(kafka, topics.ready, first + [pair(0)], key_of=lambda r: getattr(r, "group_id", "g-0"))
    produce(kafka, topics.raw, first[:8])
    with RecordProducer(kafka) as p:
        p.send_bytes(topics.raw, b"\x93not a record", key="bad")
    produce(kafka, topics.metrics, [metric(1, 2.0), metric(2, 1.0)], key_of=lambda r: r.component)
    # One flush, once all of it is read: the pair is written in one range with g-0's experiences, two files.
    # (A flush by time could end a range between them, however the polls happened to split the reading:
    # a loaded run once left the pair a range of its own.)
    everything = len(first) + 1 + 9 + 2
    config = write_config(tmp_path / f"{namespace}.yaml", namespace,
                          archive={"root": str(root), "flush_records": everything, "flush_seconds": 600})

    archiver = start_cli("archive", str(config))
    store = ArchiveStore(str(root), namespace)
    # The one flush writes its topics' files one after another, in no set order: wait for the two this
    # needs (waiting for the metrics' alone, a loaded run killed the archiver before the ready topic's).
    two_file = lambda: [f for f in store.files("experiences.ready") if f.count == 2]  # noqa: E731
    wait_for(lambda: len(two_file()) == 2 and store.files("metrics"), 120,
             "the pair's range in two files (it shares g-0's partition: two kinds) and the metrics' file",
             proc=archiver, state=lambda: {s: [(f.path, f.count) for f in store.files(s)]
                                           for s in ("experiences.ready", "metrics")})
    archiver.send_signal(signal.SIGKILL)
    archiver.wait(30)
    # A crash between the two files of one range: the range must be written again, not half kept.
    two_file = two_file()
    store.fs.delete_file(max(two_file, key=lambda f: f.index).path)
    # Record timestamps are whole milliseconds: from `mid` on, floored to one, is the second batch.
    mid = dt.datetime.now(dt.timezone.utc)
    mid = mid.replace(microsecond=mid.microsecond // 1000 * 1000)
    produce(kafka, topics.ready, second + [pair(1)], key_of=lambda r: getattr(r, "group_id", "g-0"))
    done = cli("archive", str(config), "--idle-timeout", "3")
    assert "archived" in done.stdout

    history = History.from_archive(str(root), [namespace])
    counts = record_counts(kafka, [topics.ready, topics.raw, topics.metrics])
    ready_rows = archived_offsets(history, "experiences") + archived_offsets(history, "pairs")
    assert len(ready_rows) == len(set(ready_rows)) == counts[topics.ready] == 42
    assert len(archived_offsets(history, "raw")) + 1 == counts[topics.raw] == 9  # + the undecodable one
    assert history.query("SELECT reason, stage, kafka_topic, kafka_key FROM rejected").to_pylist() == \
        [{"reason": "undecodable", "stage": "archive", "kafka_topic": topics.raw, "kafka_key": "bad"}]
    assert len(archived_offsets(history, "metrics")) == counts[topics.metrics] == 2

    # SQL through the CLI: reward by policy version as CSV, and the terminal table.
    out = tmp_path / "by_version.csv"
    cli("query", "--root", str(root), "-n", namespace, "-o", str(out),
        "SELECT policy_version, avg(reward) AS mean_reward, count(*) AS n FROM experiences GROUP BY 1 ORDER BY 1")
    rows = list(csv.DictReader(out.open()))
    assert [(int(r["policy_version"]), float(r["mean_reward"]), int(r["n"])) for r in rows] == \
        [(v, 0.4375, 4) for v in range(10)]
    shown = cli("query", "--root", str(root), "-n", namespace, "SELECT count(*) AS n FROM pairs").stdout
    assert "│ 2 │" in shown and "1 rows" in " ".join(shown.split())
    live = cli("query", "--live", "-n", namespace, "SELECT count(*) AS n FROM experiences").stdout
    assert "│ 40 │" in live

    # Replay by partition + offset range, by SQL filter: exactly the selected records, in order.
    part = history.query("SELECT kafka_partition p FROM experiences GROUP BY 1 ORDER BY count(*) DESC LIMIT 1")[0][0].as_py()
    expected = history.query(f"SELECT experience_id FROM experiences WHERE kafka_partition = {part} "
                             "AND kafka_offset BETWEEN 1 AND 6 ORDER BY kafka_offset").column(0).to_pylist()
    target = f"{namespace}-by-offset"
    sent = cli("replay", "--root", str(root), "-n", namespace, "--to", target, "--partition", str(part),
               "--first-offset", "1", "--last-offset", "6").stdout
    assert f"replayed {len(expected)} records" in sent
    got = read_ids(kafka, Topics(target).ready)
    assert sorted(got) == sorted(expected) and len(expected) >= 4

    target = f"{namespace}-by-sql"
    sent = cli("replay", "--root", str(root), "-n", namespace, "--to", target, "--where", "reward = 1").stdout
    assert "replayed 10 records" in sent
    assert sorted(read_ids(kafka, Topics(target).ready)) == sorted(f"g-{g}/0" for g in range(10))

    # Replay by time range: what was produced after the kill, exactly, in archive order.
    target = f"{namespace}-by-time"
    create_topics(kafka, target)
    with RecordProducer(kafka) as producer:
        result = replay(history, Selection(since=mid), "as_is", producer, Topics(target).ready)
    assert result.sent == result.selected == 20
    assert sorted(read_ids(kafka, Topics(target).ready)) == sorted(e.experience_id for e in second)


def read_ids(kafka, topic: str) -> list[str]:
    return [r.experience_id for r in read_all(kafka, topic, expect=Experience)]
