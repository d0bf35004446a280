"""`undertow run` with `access.per_component`: the run's own broker authorizes every request by the
ACLs `undertow acls` prints, and each component logs in as its own user, with a SCRAM password or a
client certificate made for this start, which no file of the run directory's configs holds and which
can do only that component's job."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from undertow.infra.broker.local import LocalKafka
from undertow.infra.report.metrics_log import read_metrics
from undertow.schemas import Task
from undertow.streams import KafkaSettings, RecordProducer, Topics
from undertow.streams.admin import admin_client
from undertow.streams.connect import KafkaUnreachable
from undertow.streams.producer import DeliveryError
from tests.helpers import wait_for
from tests.run_output import component_logs, demo_config, only_run_dir, undertow_run, wait_run

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def environment(pid_file: Path) -> dict[str, str] | None:
    """The environment of the process whose pid `pid_file` holds, while it runs."""
    try:
        raw = Path(f"/proc/{int(pid_file.read_text())}/environ").read_bytes()
    except (OSError, ValueError):
        return None
    return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if "=" in entry)


def run_with_logins(tmp_path: Path, access: dict) -> tuple[Path, dict[str, str]]:
    """A 3-step demo run on its own broker with `access`; (its run directory, its rollout worker's environment)."""
    path = demo_config(tmp_path, stages=[], steps=3)
    cfg = yaml.safe_load(path.read_text())
    cfg["access"] = {"per_component": True, **access}
    path.write_text(yaml.safe_dump(cfg))
    runs = tmp_path / "runs"
    proc = undertow_run(str(path), "--runs-dir", str(runs), env={"UNDERTOW_BOOTSTRAP": ""})  # its own broker
    rollout_env = wait_for(lambda: runs.exists() and environment(next(runs.glob("*/logs/0-main/rollout.pid"), Path("-"))),
                           240, "the rollout worker started", proc=proc, state=lambda: component_logs(runs))
    wait_run(proc, runs, timeout=400)
    run_dir = only_run_dir(runs)
    assert json.loads((run_dir / "run.json").read_text())["status"] == "done"
    steps = [r["version"] for r in read_metrics(run_dir / "metrics.jsonl") if r["component"] == "trainer"]
    assert steps and max(steps) == 3
    return run_dir, rollout_env


def refused_writing_ready(rollout: KafkaSettings) -> None:
    """The worker's own login: what it may not do, the broker refuses."""
    p = RecordProducer(rollout)
    try:
        p.send(Topics("demo").ready, Task(task_id="forged", prompt="1+1"))
        with pytest.raises(DeliveryError, match="TopicAuthorizationFailedError"):
            p.flush(timeout=30)
    finally:
        p.close()


@pytest.mark.timeout(600)
def test_a_run_with_a_scram_login_per_component_trains_under_the_acls(tmp_path):
    run_dir, rollout_env = run_with_logins(tmp_path, {"quotas": {"rollout": {"produce_bytes_per_s": 5.0e6}}})
    operator = LocalKafka(run_dir / "broker")
    operator_password = operator.state.sasl_users["operator"]
    user, password = rollout_env["UNDERTOW_LOGIN_USERNAME"], rollout_env["UNDERTOW_LOGIN_PASSWORD"]
    assert user == "demo-rollout" and operator_password not in rollout_env.values()
    written = "".join(p.read_text() for p in [run_dir / "config.yaml", *(run_dir / "stages").iterdir()])
    assert "${UNDERTOW_LOGIN_PASSWORD}" in written and password not in written and operator_password not in written

    operator.start()  # the run stopped its broker: back, to ask it what it holds
    try:
        with admin_client(operator.settings()) as admin:
            users = set(admin.describe_user_scram_credentials())
        assert {f"demo-{c}" for c in ("feeder", "rollout", "processors", "trainer", "eval", "archive")} <= users
        refused_writing_ready(KafkaSettings(bootstrap_servers=operator.bootstrap_servers,
                                            security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                                            sasl_username=user, sasl_password=password))
    finally:
        operator.stop()


@pytest.mark.timeout(600)
def test_a_run_with_a_certificate_per_component_trains_under_the_acls_and_rotates_them(tmp_path):
    """Mutual TLS: each component shows a certificate whose CN is its user, signed by a CA the run's
    broker made at this start; the next start makes another, and the old certificates no longer log in."""
    run_dir, rollout_env = run_with_logins(tmp_path, {"login": "certificate"})
    cert, key = rollout_env["UNDERTOW_LOGIN_CERTFILE"], rollout_env["UNDERTOW_LOGIN_KEYFILE"]
    subject = subprocess.run(["openssl", "x509", "-in", cert, "-noout", "-subject"], capture_output=True, text=True)
    assert subject.stdout.strip() == "subject=CN = demo-rollout", subject
    written = "".join(p.read_text() for p in [run_dir / "config.yaml", *(run_dir / "stages").iterdir()])
    assert "${UNDERTOW_LOGIN_CERTFILE}" in written and "${UNDERTOW_LOGIN_KEYFILE}" in written
    assert "security_protocol: SSL" in written and "PRIVATE KEY" not in written
    assert not any(k.startswith("UNDERTOW_LOGIN_") and "operator" in v for k, v in rollout_env.items())

    kept = tmp_path / "kept"  # a copy of the worker's certificate, as one that leaked would be
    kept.mkdir(mode=0o700)
    cert, key = shutil.copy(cert, kept), shutil.copy(key, kept)
    operator = LocalKafka(run_dir / "broker")
    old = operator.settings().model_copy(update={"ssl_certfile": cert, "ssl_keyfile": key})
    operator.start()  # a cold start: a new clients CA
    try:
        with pytest.raises(KafkaUnreachable, match=f"with the certificate {cert}"):
            RecordProducer(old.model_copy(update={"outage_wait_s": 0}), bootstrap_timeout_ms=3000)
        cert, key = operator.issue("demo-rollout")
        refused_writing_ready(old.model_copy(update={"ssl_certfile": str(cert), "ssl_keyfile": str(key)}))
    finally:
        operator.stop()
