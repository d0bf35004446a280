"""Bad archive / query / replay input: a clear error naming the field, before anything runs."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from undertow.infra.cli import app
from undertow.infra.run.config import RunConfig


def run(*args: str):
    return CliRunner().invoke(app, list(args))


def test_bad_archive_section_names_the_field(tmp_path: Path):
    config = tmp_path / "run.yaml"
    config.write_text("namespace: x\ntrainer: {anything: 1}\narchive:\n  topics: [weights]\n  flush_records: 0\n")
    result = run("archive", str(config))
    text = " ".join(result.output.split())
    assert result.exit_code == 2
    assert "archive.topics" in text and "experiences.ready" in text and "unknown ['weights']" in text
    assert "archive.flush_records" in text and "greater than or equal to 1" in text


def test_run_config_takes_the_archive_option():
    cfg = RunConfig.model_validate({"run": {"archive": True}, "archive": {"root": "s3://bucket/undertow"}})
    assert cfg.run.archive and cfg.archive.root == "s3://bucket/undertow"
    assert RunConfig.model_validate({}).run.archive is False


def test_query_errors_and_an_empty_archive(tmp_path: Path):
    result = run("query", "--root", str(tmp_path), "-o", str(tmp_path / "x.txt"), "SELECT 1")
    assert result.exit_code == 2 and "--out: expected a .csv or .parquet file" in result.output
    result = run("query", "--root", str(tmp_path), "SELECT count(*) AS n FROM experiences")
    assert result.exit_code == 0 and "│ 0 │" in result.output
    result = run("query", "--root", str(tmp_path), "SELECT * FROM nowhere")
    assert result.exit_code == 2 and "nowhere" in result.output
    result = run("replay", "--root", str(tmp_path), "--to", "y", "--into", "ready2")
    assert result.exit_code == 2 and "--into: expected ready or raw" in " ".join(result.output.split())
    result = run("replay", "--root", str(tmp_path), "--to", "y", "--since", "yesterday")
    assert result.exit_code == 2 and "--since: expected unix seconds or an ISO time" in " ".join(result.output.split())
