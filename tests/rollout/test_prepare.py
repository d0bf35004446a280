"""`undertow prepare`: data-juicer ops over a JSONL taskset, the prepared Parquet read back by the
feeder, and the per-op report. Expected counts are worked by hand from the rows below."""

import json

import data_juicer.ops  # noqa: F401  CI installs it (infra/requirements-nodeps.txt): missing fails, not skips
import yaml
from typer.testing import CliRunner

from undertow.infra.cli import app
from undertow.rollout.feeder.items import load_items

ROWS = [
    {"id": "a", "prompt": "What is 2 + 2\uff1f", "answer": "4"},  # full-width "?": the mapper rewrites it
    {"id": "b", "prompt": "hi", "answer": "x"},  # 2 characters: text_length_filter (min 5) drops it
    {"id": "c", "prompt": "What is 2 + 2?", "answer": "4"},  # a once normalised: the deduplicator drops c
    {"id": "d", "prompt": "What is 3 + 4?", "answer": "7"},
    {"id": "e", "messages": [{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Add 5 and 6\uff0cplease"}], "answer": "11"},
    {"id": "f", "prompt": "WHAT IS 3 + 4?", "answer": "7"},  # d in capitals: lowercase dedup drops it
]
OPS = [{"text_length_filter": {"min_len": 5}}, {"punctuation_normalization_mapper": {}},
       {"document_deduplicator": {"lowercase": True}}]


def write(tmp_path, **overrides):
    source = tmp_path / "tasks.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    cfg = {"source": {"name": "jsonl", "path": str(source)}, "ops": OPS, "out": str(tmp_path / "out" / "tasks.parquet"),
           **overrides}
    path = tmp_path / "prepare.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_prepare_filters_rewrites_dedupes_and_reports(tmp_path):
    result = CliRunner().invoke(app, ["prepare", str(write(tmp_path))])
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "tasks.report.json").read_text())
    per_op = [(o["op"], o["kind"], o["tasks_in"], o["tasks_out"], o["dropped"], o["changed"]) for o in report["ops"]]
    assert per_op == [
        ("text_length_filter", "filter", 6, 5, ["b"], []),
        ("punctuation_normalization_mapper", "mapper", 5, 5, [], ["a", "e"]),
        ("document_deduplicator", "deduplicator", 5, 3, ["c", "f"], []),
    ]
    assert (report["tasks_in"], report["tasks_out"]) == (6, 3)
    assert "6 tasks -> 3" in " ".join(result.output.split())

    # The feeder reads the prepared taskset back with its parquet source, stats kept on request.
    items = load_items({"name": "parquet", "path": str(tmp_path / "out" / "tasks.parquet"), "keep": ["dj_text_len"]})
    assert [(i.key, i.prompt, i.answer) for i in items] == [
        ("a", "What is 2 + 2?", "4"), ("d", "What is 3 + 4?", "7"), ("e", "", "11")]
    assert items[2].messages == [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Add 5 and 6,please"}]  # the last user message rewritten
    assert [i.metadata["dj_text_len"] for i in items] == [14, 14, 18]  # lengths before the mapper ran


def test_bad_prepare_files_name_the_field(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["prepare", str(write(tmp_path, out=str(tmp_path / "x.jsonl")))])
    assert result.exit_code == 2 and "out: expected a .parquet file" in " ".join(result.output.split())
    result = runner.invoke(app, ["prepare", str(write(tmp_path, ops=[{"no_such_filter": {}}]))])
    assert result.exit_code == 2 and "unknown op(s) ['no_such_filter']" in " ".join(result.output.split())


def test_difficulty_scoring_writes_each_tasks_pass_rate_and_the_selector_orders_by_it(tmp_path):
    """Tasks whose reward is fixed by their metadata have known pass rates (1 and 0); the engine must
    have answered each `samples` times, and keep_between drops the one outside the bounds."""
    from tests.rollout.plugins import SCORED
    from undertow.rollout.feeder.selectors import selectors

    rows = [{"id": "never", "prompt": "1+1=", "answer": "2", "passes": 0},
            {"id": "always", "prompt": "2+2=", "answer": "4", "passes": 1},
            {"id": "always-too", "prompt": "3+3=", "answer": "6", "passes": 1}]
    source = tmp_path / "tasks.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    difficulty = {"model": {"source": "tiny"}, "samples": 3, "keep_between": [0.5, 1.0],
                  "rollout": {"reward": "tests.rollout.plugins.by_metadata", "chat_template": False,
                              "sampling": {"max_new_tokens": 2}}}
    path = tmp_path / "prepare.yaml"
    path.write_text(yaml.safe_dump({"source": {"name": "jsonl", "path": str(source), "keep": ["passes"]},
                                    "difficulty": difficulty, "out": str(tmp_path / "scored.parquet")}))
    SCORED.clear()
    result = CliRunner().invoke(app, ["prepare", str(path)])
    assert result.exit_code == 0, result.output
    assert sorted(t for t, _ in SCORED) == ["always"] * 3 + ["always-too"] * 3 + ["never"] * 3
    report = json.loads((tmp_path / "scored.report.json").read_text())
    assert [(o["op"], o["tasks_in"], o["tasks_out"], o["dropped"]) for o in report["ops"]] == [
        ("difficulty", 3, 2, ["never"])]
    items = load_items({"name": "parquet", "path": str(tmp_path / "scored.parquet"), "keep": ["model_pass_rate"]})
    assert [(i.key, i.metadata["model_pass_rate"]) for i in items] == [("always", 1.0), ("always-too", 1.0)]

    # As a run's taskset source: read back while nothing changed, prepared again when the source did.
    SCORED.clear()
    cached = load_items({"name": "prepared", "file": str(path)})
    assert SCORED == [] and [(i.key, i.metadata["model_pass_rate"]) for i in cached] == [("always", 1.0), ("always-too", 1.0)]
    source.write_text(source.read_text() + json.dumps({"id": "new", "prompt": "4+4=", "answer": "8", "passes": 1}) + "\n")
    assert [i.key for i in load_items({"name": "prepared", "file": str(path)})] == ["always", "always-too", "new"]
    assert len(SCORED) == 4 * 3

    # The pass rate orders a curriculum: the highest pass rate is the easiest (ties keep the source's order).
    unsorted = [type(items[0])("hard", "5+5=", [], "10", {"model_pass_rate": 0.25}), *items]
    easy_first = selectors.resolve({"name": "easy_to_hard", "by": "model_pass_rate", "higher_is_easier": True})()
    import random
    assert [unsorted[easy_first.pick(unsorted, d, lambda i: (0, 0), random.Random(0))].key for d in range(3)] == [
        "always", "always-too", "hard"]
