"""`undertow train` refuses a bad config with the field and what was expected, before touching Kafka."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from undertow.infra.cli import app


def test_bad_trainer_config_names_the_field(tmp_path: Path):
    config = tmp_path / "run.yaml"
    config.write_text("namespace: x\nrollout: {anything: 1}\ntrainer:\n  engine: {zero_stage: 5}\n"
                      "  batching: {experiences: 8, token_budget: 100}\n")
    result = CliRunner().invoke(app, ["train", str(config)])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert "trainer.engine.zero_stage" in text and "0, 1, 2 or 3" in text
    assert "experiences / token_budget: set exactly one" in text
