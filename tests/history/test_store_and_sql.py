"""The archive on disk, SQL over it, and the replay shapes, without a broker."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from undertow.schemas import Experience, PreferencePair
from undertow.streams.archive import archived
from undertow.streams.archive_store import ArchivedMessage, ArchiveStore
from undertow.streams.history import History
from undertow.streams.replay import Selection, replay_shapes, select

from .helpers import make_group, metric, recorded_run

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def messages(records, first_offset=0, partition=0, step_ms=1000):
    return [ArchivedMessage(r, partition, first_offset + i, T0_MS + step_ms * (first_offset + i), b"k")
            for i, r in enumerate(records)]


def test_ranges_resume_after_the_last_complete_one_and_torn_flushes_are_redone(tmp_path: Path):
    store = ArchiveStore(str(tmp_path), "ns")
    run = recorded_run(2)
    store.write_range("experiences.ready", "ns.experiences.ready", 0, 0, 3, messages(run[:4]))
    store.write_range("experiences.ready", "ns.experiences.ready", 1, 0, 9, messages(run[4:8], partition=1))
    assert store.scan("experiences.ready").next_offsets == {0: 4, 1: 10}
    # A flush of mixed kinds makes two files; a crash after the first leaves the range incomplete.
    pair = PreferencePair(pair_id="p", task_id="t", prompt_tokens=[1], chosen_tokens=[2], rejected_tokens=[3])
    paths = store.write_range("experiences.ready", "ns.experiences.ready", 0, 4, 5,
                              messages([run[0], pair], first_offset=4))
    assert len(paths) == 2 and store.scan("experiences.ready").next_offsets[0] == 6
    store.fs.delete_file(paths[1])
    assert store.recover("experiences.ready") == {0: 4, 1: 10}
    assert not Path(paths[0]).exists() and len(store.files("experiences.ready")) == 2
    table = pq.read_table(store.files("experiences.ready")[0].path)
    assert table.column("kafka_offset").to_pylist() == [0, 1, 2, 3]
    assert table.column("kafka_topic").to_pylist() == ["ns.experiences.ready"] * 4
    assert table.column("namespace").to_pylist() == ["ns"] * 4


def test_undecodable_bytes_become_rejected_rows():
    row = archived(b"\x00not msgpack", "ns.experiences.raw", 2, 17, T0_MS, None)
    assert row.record.kind == "rejected" and row.record.stage == "archive"
    assert row.record.reason == "undecodable" and (row.record.partition, row.record.offset) == (2, 17)


@pytest.fixture
def history(tmp_path: Path) -> History:
    store = ArchiveStore(str(tmp_path), "ns")
    run = recorded_run(3)  # policy_version = group index; rewards 1, 0, .5, .25 per sample
    store.write_range("experiences.ready", "ns.experiences.ready", 0, 0, 11, messages(run))
    store.write_range("metrics", "ns.metrics", 0, 0, 1, messages([metric(1, 2.0), metric(2, 1.0)]))
    bad = archived(b"junk", "ns.experiences.raw", 0, 0, T0_MS, None)
    store.write_range("experiences.raw", "ns.experiences.raw", 0, 0, 0, [bad])
    return History.from_archive(str(tmp_path))


def test_sql_aggregates_over_the_views(history: History):
    by_version = history.query("SELECT policy_version, avg(reward) AS r, count(*) AS n FROM experiences "
                               "GROUP BY 1 ORDER BY 1").to_pylist()
    assert by_version == [{"policy_version": v, "r": 0.4375, "n": 4} for v in range(3)]
    best = history.query("SELECT sample_index, sum(reward_components['correct']) AS c FROM experiences "
                         "GROUP BY 1 ORDER BY 1").column("c").to_pylist()
    assert best == [3.0, 0.0, 0.0, 0.0]
    assert history.query("SELECT avg(\"values\"['loss']) AS l FROM metrics").column("l").to_pylist() == [1.5]
    assert history.query("SELECT reason, count(*) AS n FROM rejected GROUP BY 1").to_pylist() == \
        [{"reason": "undecodable", "n": 1}]
    assert history.query("SELECT count(*) AS n FROM raw").column("n").to_pylist() == [0]
    with pytest.raises(ValueError, match="query:"):
        history.query("SELECT nope FROM experiences")


def test_selection_by_offsets_time_and_filter(history: History):
    ids = lambda s: [r.experience_id for r in select(history, s)]  # noqa: E731
    assert ids(Selection(first_offset=2, last_offset=5)) == ["g-0/2", "g-0/3", "g-1/0", "g-1/1"]
    since = dt.datetime.fromtimestamp(T0_MS / 1000 + 9, dt.timezone.utc)
    assert ids(Selection(since=since)) == ["g-2/1", "g-2/2", "g-2/3"]
    until = dt.datetime.fromtimestamp(T0_MS / 1000 + 2, dt.timezone.utc)
    assert ids(Selection(until=until)) == ["g-0/0", "g-0/1"]
    assert ids(Selection(where="reward >= 0.5 AND policy_version > 0")) == ["g-1/0", "g-1/2", "g-2/0", "g-2/2"]
    assert ids(Selection(where="reward > 0", namespace="other")) == []
    with pytest.raises(ValueError, match="view"):
        Selection(view="nope").sql()


def test_shapes_build_sft_dpo_and_raw_records():
    run = make_group(0) + make_group(1)
    sft = replay_shapes.resolve("sft_best").obj(run)
    assert [(e.experience_id, e.group_id, e.group_size, e.sample_index) for e in sft] == \
        [("g-0/0", "g-0/0", 1, 0), ("g-1/0", "g-1/0", 1, 0)]
    picky = replay_shapes.resolve({"name": "sft_best", "min_reward": 1.5})
    assert (picky.name, picky.obj, picky.kwargs) == ("sft_best", replay_shapes.get("sft_best"), {"min_reward": 1.5})
    assert replay_shapes.get("sft_best")(run, min_reward=1.5) == []
    pairs = replay_shapes.get("dpo_pairs")(run)
    assert [(p.pair_id, p.chosen_text, p.rejected_text) for p in pairs] == [("g-0/0>1", "0", "1"), ("g-1/0>1", "2", "3")]
    assert pairs[0].metadata["chosen_reward"] == 1.0 and pairs[0].metadata["rejected_reward"] == 0.0
    assert replay_shapes.get("dpo_pairs")(run, min_margin=1.0) == []  # margin 1 is not more than 1
    raw = replay_shapes.get("unprocessed")(run)
    assert all(e.advantages == [] and e.behaviour_logprobs for e in raw)
    assert replay_shapes.get("as_is")(run) == run
    unscored = run[0].model_copy(update={"reward": None})
    with pytest.raises(ValueError, match="no reward"):
        replay_shapes.get("sft_best")([unscored])
    with pytest.raises(ValueError, match="unexpected argument"):
        replay_shapes.resolve({"name": "dpo_pairs", "margin": 1})
    assert isinstance(sft[0], Experience)
