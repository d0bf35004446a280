"""`undertow broker` and `undertow topics` against a broker the CLI starts; data survives down + up."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from undertow.infra.cli import app
from undertow.infra.broker.local import free_port_block
from undertow.schemas import Task
from undertow.streams import CATALOG, KafkaSettings, RecordConsumer, RecordProducer, Topics
from tests.helpers import take

pytestmark = [pytest.mark.broker, pytest.mark.slow]


def undertow(*args: str, env: dict, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "undertow.infra.cli", *args], env=env, capture_output=True, text=True,
                          timeout=240)
    if check:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture
def cli_env(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "UNDERTOW_BOOTSTRAP"}
    env.update(UNDERTOW_HOME=str(tmp_path / "home"), COLUMNS="200")
    return env


def test_broker_up_topics_down_up_keeps_data(cli_env, tmp_path):
    port = free_port_block(2)
    up = undertow("broker", "up", "--port", str(port), env=cli_env)
    assert f"127.0.0.1:{port}" in up.stdout and "Kafka 4." in up.stdout
    try:
        assert "running" in undertow("broker", "status", env=cli_env).stdout
        listed = undertow("topics", "list", "-n", "demo", env=cli_env).stdout
        assert listed.count("│ no ") == len(CATALOG)  # the whole catalog, not yet created

        created = undertow("topics", "create", "-n", "demo", env=cli_env).stdout
        assert f"created {len(CATALOG)} topic(s)" in created
        listed = undertow("topics", "list", "-n", "demo", env=cli_env).stdout
        assert listed.count("│ yes ") == len(CATALOG) and "demo.experiences.ready" in listed

        kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{port}")
        with RecordProducer(kafka) as p:
            for i in range(5):
                p.send(Topics("demo").tasks, Task(task_id=f"t{i}", prompt="1+1"), partition=0)

        undertow("broker", "down", env=cli_env)
        stopped = undertow("broker", "status", env=cli_env, check=False)
        assert stopped.returncode == 1 and "stopped" in stopped.stdout

        undertow("broker", "up", env=cli_env)  # same data dir, same ports from its cluster.json
        described = undertow("topics", "describe", "-n", "demo", env=cli_env).stdout
        assert "demo.tasks" in described and "retention.ms=604800000" in described
        with RecordConsumer(kafka, [Topics("demo").tasks], group_id=None, expect=Task,
                            rejected_topic=Topics("demo").rejected) as c:
            got = take(c, 5, 60, "the 5 tasks sent before the broker went down")
        assert [d.record.task_id for d in got] == [f"t{i}" for i in range(5)]
    finally:
        undertow("broker", "down", env=cli_env, check=False)


def test_external_cluster_starts_nothing(cli_env, kafka):
    env = {**cli_env, "UNDERTOW_BOOTSTRAP": kafka.bootstrap_servers}
    out = undertow("broker", "up", env=env).stdout
    assert "starting nothing" in out
    assert not (tmp := cli_env["UNDERTOW_HOME"]) or not os.path.exists(os.path.join(tmp, "broker", "cluster.json"))
    assert "undertow.tasks" in undertow("topics", "list", env=env).stdout


def test_no_broker_is_a_clear_error(cli_env):
    proc = undertow("topics", "list", env=cli_env, check=False)
    assert proc.returncode == 2 and "undertow broker up" in proc.stderr and "Traceback" not in proc.stderr


def test_help_lists_the_command_groups():
    # In-process: help needs no broker, and two more CLI start-ups cost this suite 20 s under load.
    out = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200"}).stdout
    assert "broker" in out and "topics" in out
    assert "--cluster" in CliRunner().invoke(app, ["broker", "up", "--help"], env={"COLUMNS": "200"}).stdout
