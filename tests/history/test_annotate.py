"""`undertow annotate`: archived experiences out as Label Studio tasks, annotations (Label Studio's JSON
export format) back as human rewards or preference pairs, on files; then onto topics through the broker."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from undertow.infra.cli import app
from undertow.schemas import Experience, PreferencePair, from_arrow
from undertow.streams import Topics
from undertow.streams.archive_store import ArchivedMessage, ArchiveStore
from tests.helpers import read_all

from .helpers import recorded_run

# groups g-0, g-1; rewards 1, 0, .5, .25 by sample; stamped with a tokenizer fingerprint as rollout workers do
RUN = {e.experience_id: e.model_copy(update={"metadata": {"tokenizer": "tok-1"}}) for e in recorded_run(2)}


@pytest.fixture
def root(tmp_path: Path) -> str:
    messages = [ArchivedMessage(e, 0, i, 1_700_000_000_000 + i, e.group_id.encode()) for i, e in enumerate(RUN.values())]
    ArchiveStore(str(tmp_path / "archive"), "ns").write_range("experiences.ready", "ns.experiences.ready", 0, 0,
                                                               len(messages) - 1, messages)
    return str(tmp_path / "archive")


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return " ".join(result.output.split())


def labelled(tasks: list[dict], annotations: dict[int, list[list[dict]]]) -> list[dict]:
    """Tasks as Label Studio exports them: an id each, and per annotator a result list."""
    return [{"id": n, "data": t["data"], "annotations": [{"id": 100 * n + k, "result": r, "was_cancelled": False}
                                                          for k, r in enumerate(annotations.get(n, []))]}
            for n, t in enumerate(tasks)]


def stars(n: int) -> list[dict]:
    return [{"from_name": "rating", "to_name": "response", "type": "rating", "value": {"rating": n}}]


def pick(side: str) -> list[dict]:
    return [{"from_name": "preference", "to_name": "response_a,response_b", "type": "pairwise", "value": {"selected": side}}]


def ratings_round_trip(root: str, tmp_path: Path) -> Path:
    out = cli("annotate", "export", "--root", root, "--where", "group_id = 'g-0'", "-o", str(tmp_path / "rate.json"))
    assert "wrote 4 rating tasks from 4 experiences" in out
    tasks = json.loads((tmp_path / "rate.json").read_text())
    assert [t["data"]["experience_id"] for t in tasks] == ["g-0/0", "g-0/1", "g-0/2", "g-0/3"]
    assert tasks[0]["data"]["response"] == RUN["g-0/0"].response_text and tasks[0]["data"]["prompt"] == "0+0="
    assert 'maxRating="5"' in (tmp_path / "rate.label_config.xml").read_text()
    export = labelled(tasks, {0: [stars(5), stars(4)], 1: [stars(1)], 3: [stars(3)]})
    export[2]["annotations"] = [{"id": 9, "result": stars(5), "was_cancelled": True}]  # cancelled: no verdict
    export.append({"id": 99, "data": {"experience_id": "g-9/0"}, "annotations": [{"result": stars(2)}]})
    path = tmp_path / "ls-ratings.json"
    path.write_text(json.dumps(export))
    return path


def test_ratings_come_back_as_human_rewards(root, tmp_path):
    export = ratings_round_trip(root, tmp_path)
    out = cli("annotate", "import", str(export), "--root", root, "-o", str(tmp_path / "rewards.parquet"))
    assert "imported 3 experience records (2 tasks skipped)" in out
    back = from_arrow(pq.read_table(tmp_path / "rewards.parquet"), Experience)
    # (mean - 1) / (5 - 1): stars 5 and 4 -> 4.5 -> 0.875; 1 -> 0; 3 -> 0.5
    assert [(e.experience_id, e.reward, e.reward_components) for e in back] == [
        ("g-0/0", 0.875, {"human": 0.875}), ("g-0/1", 0.0, {"human": 0.0}), ("g-0/3", 0.5, {"human": 0.5})]
    assert [e.metadata["model_reward"] for e in back] == [1.0, 0.0, 0.25]
    assert all(e.response_tokens == RUN[e.experience_id].response_tokens and
               e.behaviour_logprobs == RUN[e.experience_id].behaviour_logprobs for e in back)


def test_pairwise_picks_come_back_as_preference_pairs(root, tmp_path):
    cli("annotate", "export", "--root", root, "--mode", "pairwise", "-o", str(tmp_path / "pw.json"))
    tasks = json.loads((tmp_path / "pw.json").read_text())
    assert [(t["data"]["id_a"], t["data"]["id_b"]) for t in tasks] == [
        ("g-0/0", "g-0/1"), ("g-0/2", "g-0/3"), ("g-1/0", "g-1/1"), ("g-1/2", "g-1/3")]
    # g-0 0|1: right twice, left once -> 1 beats 0; g-0 2|3: a tie; g-1 0|1: left -> 0 beats 1; g-1 2|3: none
    export = labelled(tasks, {0: [pick("right"), pick("left"), pick("right")], 1: [pick("left"), pick("right")],
                              2: [pick("left")]})
    (tmp_path / "ls-pw.json").write_text(json.dumps(export))
    out = cli("annotate", "import", str(tmp_path / "ls-pw.json"), "--root", root, "-o", str(tmp_path / "pairs.parquet"))
    assert "imported 2 preference_pair records (2 tasks skipped)" in out
    pairs = from_arrow(pq.read_table(tmp_path / "pairs.parquet"), PreferencePair)
    assert [p.pair_id for p in pairs] == ["g-0/1>0@human", "g-1/0>1@human"]
    assert pairs[0].chosen_tokens == RUN["g-0/1"].response_tokens and pairs[0].rejected_tokens == RUN["g-0/0"].response_tokens
    assert pairs[0].prompt_tokens == RUN["g-0/0"].prompt_tokens and pairs[0].metadata["votes"] == [2, 3]
    assert pairs[0].metadata["tokenizer"] == "tok-1"  # the trainer checks it


def test_import_needs_a_destination_and_a_label_studio_export(root, tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"not": "a list"}))
    result = CliRunner().invoke(app, ["annotate", "import", str(tmp_path / "x.json"), "--root", root])
    assert result.exit_code == 2 and "--to NAMESPACE, --out FILE.parquet" in " ".join(result.output.split())
    result = CliRunner().invoke(app, ["annotate", "import", str(tmp_path / "x.json"), "--root", root, "-o", str(tmp_path / "o.parquet")])
    assert result.exit_code == 2 and "expected Label Studio's JSON export" in " ".join(result.output.split())


@pytest.mark.broker
def test_annotations_reach_the_topics_a_trainer_reads(root, tmp_path, kafka, namespace):
    """Rewards to the raw topic (advantages cleared for the processors), pairs to the ready topic."""
    cli("annotate", "import", str(ratings_round_trip(root, tmp_path)), "--root", root, "--to", namespace)
    cli("annotate", "export", "--root", root, "--mode", "pairwise", "--where", "group_id = 'g-1'", "-o", str(tmp_path / "pw.json"))
    export = labelled(json.loads((tmp_path / "pw.json").read_text()), {1: [pick("right")]})
    (tmp_path / "ls-pw.json").write_text(json.dumps(export))
    cli("annotate", "import", str(tmp_path / "ls-pw.json"), "--root", root, "--to", namespace)
    topics = Topics(namespace)
    raw = sorted(read_all(kafka, topics.raw, Experience), key=lambda e: e.experience_id)
    assert [(e.experience_id, e.reward, e.advantages) for e in raw] == [("g-0/0", 0.875, []), ("g-0/1", 0.0, []), ("g-0/3", 0.5, [])]
    assert [p.pair_id for p in read_all(kafka, topics.ready, PreferencePair)] == ["g-1/3>2@human"]
