"""`undertow config check|show`: every section validated with the field named, or each stage shown whole."""

from __future__ import annotations

from pathlib import Path

import yaml
from typer.testing import CliRunner

from undertow.infra.cli import app
from tests.helpers import write_config

ROOT = Path(__file__).resolve().parents[2]
TWO_STAGES = {"rollout": {"sampling": {"temperature": 0.5}}, "trainer": {"algorithm": {"temperature": 0.5}},
              "run": {"stages": [{"name": "sft", "steps": 3, "trainer": {"algorithm": {"objective": "sft"}},
                                  "processors": {"pipeline": ["clean"]}},
                                 {"name": "rl", "steps": 7}]}}


def config(tmp_path: Path, command: str, **sections) -> tuple[int, str]:
    path = write_config(tmp_path / "run.yaml", "lab", **sections)
    result = CliRunner().invoke(app, ["config", command, str(path)])
    return result.exit_code, result.output


def test_check_says_ok_and_summarizes_each_stage(tmp_path):
    code, output = config(tmp_path, "check", **TWO_STAGES)
    assert code == 0, output
    assert output.startswith("ok ") and output.count("\n") == 1, output
    assert "sft (3 steps): namespace lab-sft, sft, pipeline [clean]" in output
    assert "rl (7 steps): namespace lab-rl, rl, pipeline [clean, reshape, prioritize]" in output


def test_check_accepts_the_demo():
    result = CliRunner().invoke(app, ["config", "check", str(ROOT / "examples" / "demo.yaml")])
    assert result.exit_code == 0 and "warmup (60 steps)" in result.output, result.output


def test_a_bad_pipeline_name_fails_naming_the_field(tmp_path):
    code, output = config(tmp_path, "check", processors={"pipeline": ["clean", "clena"]})
    text = " ".join(output.split())  # rich wraps long lines
    assert code == 2 and text.startswith("error:"), output
    assert "processors.pipeline: processor 'clena': unknown" in text


def test_a_pipeline_argument_of_the_wrong_type_fails_naming_the_stage_and_argument(tmp_path):
    code, output = config(tmp_path, "check", processors={"pipeline": ["clean", {"name": "reshape",
                                                                                 "dynamic_sampling": [1]}]})
    text = " ".join(output.split())
    assert code == 2, output
    assert "processors.pipeline: processor 'reshape': argument dynamic_sampling = [1]" in text
    assert "valid boolean" in text


def test_a_temperature_mismatch_in_one_stage_fails_naming_the_stage_and_both_fields(tmp_path):
    stages = [{"name": "rl", "steps": 2, "rollout": {"sampling": {"temperature": 0.7}}}]
    code, output = config(tmp_path, "check", run={"stages": stages})
    text = " ".join(output.split())
    assert code == 2, output
    assert "run.stages.0 (rl)" in text
    assert "rollout.sampling.temperature (0.7) must equal trainer.algorithm.temperature (1.0)" in text


def test_a_wrong_type_fails_naming_the_field_path(tmp_path):
    code, output = config(tmp_path, "check", trainer={"engine": {"lr": "fast"}})
    assert code == 2 and "trainer.engine.lr" in " ".join(output.split()), output


def test_show_prints_each_stage_merged_with_every_default(tmp_path):
    code, output = config(tmp_path, "show", **TWO_STAGES)
    assert code == 0, output
    sft, rl = yaml.safe_load_all(output)
    assert sft["namespace"] == "lab-sft" and rl["namespace"] == "lab-rl"
    assert sft["trainer"]["algorithm"]["objective"] == "sft" and rl["trainer"]["algorithm"]["objective"] == "rl"
    assert sft["processors"]["pipeline"] == ["clean"]
    assert rl["trainer"]["algorithm"]["temperature"] == 0.5  # the run's section, under the stage
    assert rl["processors"]["batch_size"] == 256 and rl["rollout"]["cap_wait_s"] == 300.0  # defaults, never written
    assert "run" not in rl  # the supervisor's section: no stage process reads it


def test_show_prints_a_single_stage_run_as_one_document(tmp_path):
    code, output = config(tmp_path, "show")
    (only,) = yaml.safe_load_all(output)
    assert code == 0 and output.startswith("# stage main\n") and only["namespace"] == "lab"


def test_show_hides_the_passwords(tmp_path):
    kafka = {"bootstrap_servers": "b:9093", "security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
             "sasl_username": "u", "sasl_password": "hunter2", "ssl_password": "keypass"}
    code, output = config(tmp_path, "show", kafka=kafka)
    assert code == 0 and "hunter2" not in output and "keypass" not in output, output
    assert yaml.safe_load(output)["kafka"]["sasl_password"] == "***"


def test_reading_a_config_imports_no_torch():
    """The feeder, the processors, the archive, the watchers and `undertow status|tail|config check`
    read the run's config, and torch's import costs each of them over a second of CPU: the
    registries they check it against import torch only when a component computes (kernel/lazy.py)."""
    import subprocess
    import sys

    code = ("import sys, undertow.infra.cli, undertow.processors.runner, undertow.streams.archive, "
            "undertow.watchers.runner, undertow.infra.run.runner; "
            "from undertow.infra.run.config import load_run_config; load_run_config('examples/demo.yaml'); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, cwd=ROOT).stdout
    assert out.split() == ["False"], out


def test_an_error_message_with_brackets_is_printed_as_it_is(capsys):
    """gloo's messages start with `[/path/pair.cc:545]`, which rich read as a closing markup tag: the
    red line raised MarkupError instead of saying what failed."""
    import typer

    from undertow.infra.cli.common import user_errors

    message = "[/__w/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Connection closed by peer"
    try:
        with user_errors():
            raise RuntimeError(message)
    except typer.Exit as e:
        assert e.exit_code == 2
    assert message in " ".join(capsys.readouterr().err.split())
