"""`undertow process`: config errors name the field; the shipped example config loads."""

from pathlib import Path

import yaml
from typer.testing import CliRunner

from undertow.infra.cli import app
from undertow.infra.run.config import load_component_config

ROOT = Path(__file__).resolve().parents[2]


def run(tmp_path, config: dict):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return CliRunner().invoke(app, ["process", str(path)])


def test_a_bad_field_is_named_with_what_was_expected(tmp_path):
    result = run(tmp_path, {"processors": {"group_timeout_s": -1, "on_timeout": "later"}})
    assert result.exit_code == 2
    assert "processors.group_timeout_s" in result.output and "greater than 0" in result.output
    assert "processors.on_timeout" in result.output and "'emit' or 'reject'" in result.output


def test_an_unknown_processor_or_argument_is_named(tmp_path):
    result = run(tmp_path, {"processors": {"pipeline": ["clean", "no_such_stage"]}})
    assert result.exit_code == 2 and "no_such_stage" in result.output
    result = run(tmp_path, {"processors": {"pipeline": [{"name": "reshape", "advantage": "ppo"}]}})
    assert result.exit_code == 2 and "'ppo'" in result.output


def test_every_shipped_processors_config_loads():
    configs = sorted((ROOT / "examples").glob("processors_*.yaml"))
    assert len(configs) == 1
    for path in configs:
        cfg = load_component_config(path).processors
        assert [e if isinstance(e, str) else e["name"] for e in cfg.pipeline] == ["clean", "score", "reshape", "prioritize"]
