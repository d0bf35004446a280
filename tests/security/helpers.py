"""What the security tests share: a LocalKafka's broker properties, and undertow's CLI run against it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import yaml

from infra.broker import LocalKafka
from streams import KafkaSettings

ROOT = Path(__file__).resolve().parents[2]


def props(local: LocalKafka) -> dict[str, str]:
    """The server.properties LocalKafka writes for node 1, as a dict."""
    text = local._properties(local._node(1))
    return dict(line.split("=", 1) for line in text.splitlines())


def undertow(*args: str, config: Path, tmp_path: Path, **popen) -> dict:
    """Popen/run arguments for `undertow ARGS CONFIG` in tmp_path (Faust writes its data dir there)."""
    env = {k: v for k, v in os.environ.items() if k != "UNDERTOW_BOOTSTRAP"}  # it would override the config's
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return dict(args=[sys.executable, "-m", "infra.cli", *args, str(config)], cwd=tmp_path, env=env, **popen)


def run_config(tmp_path: Path, ns: str, kafka: KafkaSettings, **sections) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"namespace": ns, "kafka": kafka.model_dump(exclude_none=True), **sections}))
    return path
