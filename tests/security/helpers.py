"""What the security tests share: a LocalKafka's broker properties, undertow's CLI run against it, a
client certificate, and a group sent through a real processor worker to the trainer's feed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import yaml

from undertow.infra.broker.local import LocalKafka
from undertow.schemas import Experience
from undertow.streams import KafkaSettings, RecordProducer, Topics
from tests.helpers import group, wait_for
from undertow.trainer.config import BatchingConfig
from undertow.trainer.ready_intake import ReadyIntake

ROOT = Path(__file__).resolve().parents[2]


def props(local: LocalKafka) -> dict[str, str]:
    """The server.properties LocalKafka writes for node 1, as a dict."""
    text = local._properties(local._node(1))
    return dict(line.split("=", 1) for line in text.splitlines())


def undertow(*args: str, config: Path, tmp_path: Path, **popen) -> dict:
    """Popen/run arguments for `undertow ARGS CONFIG` in tmp_path (Faust writes its data dir there)."""
    env = {k: v for k, v in os.environ.items() if k != "UNDERTOW_BOOTSTRAP"}  # it would override the config's
    env.update(PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    return dict(args=[sys.executable, "-m", "undertow.infra.cli", *args, str(config)], cwd=tmp_path, env=env, **popen)


def run_config(tmp_path: Path, ns: str, kafka: KafkaSettings, **sections) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"namespace": ns, "kafka": kafka.model_dump(exclude_none=True), **sections}))
    return path


def client_certificate(tmp_path: Path, password: str) -> Path:
    """A client CA (returned) and `cert.pem` / `key.pem` it signs, the key encrypted with `password`."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=tmp_path, check=True, capture_output=True)

    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"]
    openssl("req", "-x509", *ec, "-nodes", "-keyout", "client-ca.key", "-out", "client-ca.pem",
            "-subj", "/CN=undertow test clients", "-days", "1")
    openssl("req", "-new", *ec, "-keyout", "key.pem", "-passout", f"pass:{password}", "-out", "client.csr",
            "-subj", "/CN=trainer")
    openssl("x509", "-req", "-in", "client.csr", "-CA", "client-ca.pem", "-CAkey", "client-ca.key",
            "-CAcreateserial", "-out", "cert.pem", "-days", "1")
    return tmp_path / "client-ca.pem"


def through_worker_to_feed(ns: str, producer: KafkaSettings, worker: KafkaSettings, tmp_path: Path) -> tuple[list, dict]:
    """Publish one group with `producer`'s settings; an `undertow process` worker and the trainer's
    feed both connect with `worker`'s (from a config). Returns the feed's batch and its commit."""
    topics = Topics(ns)
    config = run_config(tmp_path, ns, worker, processors={"pipeline": ["clean", "reshape"], "app_id": f"proc-{ns}"})
    with open(tmp_path / "process.log", "w") as log:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(**undertow("process", config=config, tmp_path=tmp_path, stdout=log,
                                           stderr=subprocess.STDOUT))
    samples = group("g0", [0.0, 1.0], behaviour_logprobs=[-0.5] * 3)  # the trainer refuses records without them
    try:
        with RecordProducer(producer) as p:
            for e in samples:
                p.send(topics.raw, e, key=e.group_id)
        feed = ReadyIntake(worker, topics, BatchingConfig(experiences=2), group_id=f"{ns}-trainer",
                           record_type=Experience, checks_staleness=True, producer=RecordProducer(worker), start={},
                           trained_ids=[])

        def next_batch():
            feed.fill(version=0, timeout_ms=500)
            return feed.next_batch(version=0, max_wait_s=60)

        batch = wait_for(next_batch, 120, "a batch through the processors", proc=proc, every=0,
                         state=lambda: (tmp_path / "process.log").read_text()[-3000:])
        feed.trained_on(batch)
        committed = feed.commit()
        feed.close()
        feed.producer.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return batch, committed
