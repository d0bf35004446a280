"""No Kafka password in a run directory: config.yaml and stages/*.yaml keep `${ENV_VAR}` references
(the user's own, or UNDERTOW_KAFKA_* for a password written in clear), every file there is grepped
for the secrets, and the configs a `--resume` and each component read back resolve them again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from undertow.infra.run.config import load_component_config, load_run_config
from undertow.infra.run.runner import Run, new_run_dir
from undertow.kernel.config_io import ConfigError
from undertow.streams.weights.broadcast import TOKEN_ENV
from tests.helpers import write_config

FROM_ENV, IN_CLEAR = "s3cr3t-from-the-env", "s3cr3t-written-in-clear"


def test_a_run_directory_holds_references_never_the_passwords(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("LAB_KAFKA_PASSWORD", FROM_ENV)
    monkeypatch.setenv("UNDERTOW_KAFKA_SSL_PASSWORD", "")  # the run sets it: as before after the test
    monkeypatch.delenv("UNDERTOW_KAFKA_SSL_PASSWORD")  # (setenv records its state, a delenv of a missing one not)
    path = write_config(tmp_path / "lab.yaml", "lab", kafka={
        "bootstrap_servers": "127.0.0.1:9", "security_protocol": "SASL_SSL", "sasl_mechanism": "PLAIN",
        "sasl_username": "alice", "sasl_password": "${LAB_KAFKA_PASSWORD}", "ssl_password": IN_CLEAR})
    cfg, raw = load_run_config(path)
    assert (cfg.kafka.sasl_password, cfg.kafka.ssl_password) == (FROM_ENV, IN_CLEAR)
    assert FROM_ENV not in repr(cfg.kafka) and IN_CLEAR not in repr(cfg.kafka)  # nor in a logged repr

    run_dir = new_run_dir(cfg, raw, tmp_path / "runs")
    run = Run(cfg, raw, run_dir)
    run.kafka = cfg.kafka
    stage, _, _ = run._stage_config(0, None)  # what each component is started with
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"config.yaml", stage.name}
    token = run.child_env[TOKEN_ENV]  # the broadcast rendezvous' token, for the components the run starts
    assert len(token) == 32
    for p in files:
        text = p.read_text()
        assert FROM_ENV not in text and IN_CLEAR not in text and token not in text, p
    assert "${LAB_KAFKA_PASSWORD}" in stage.read_text() and "${UNDERTOW_KAFKA_SSL_PASSWORD}" in stage.read_text()

    # The components inherit the run's environment: the stage config resolves; so does a resume's.
    assert os.environ["UNDERTOW_KAFKA_SSL_PASSWORD"] == IN_CLEAR
    component = load_component_config(stage)
    assert (component.kafka.sasl_password, component.kafka.ssl_password) == (FROM_ENV, IN_CLEAR)
    resumed, _ = load_run_config(run_dir / "config.yaml")
    assert (resumed.kafka.sasl_password, resumed.kafka.ssl_password) == (FROM_ENV, IN_CLEAR)
    # A resume in a shell without the variable is refused naming the field and the variable.
    monkeypatch.delenv("UNDERTOW_KAFKA_SSL_PASSWORD")
    with pytest.raises(ConfigError, match=r"kafka.ssl_password.*\$\{UNDERTOW_KAFKA_SSL_PASSWORD\} is not set"):
        load_run_config(run_dir / "config.yaml")
