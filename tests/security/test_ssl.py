"""Every client speaks TLS with the `kafka:` settings, against a broker of its own whose listener is SSL."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from undertow.infra.broker.local import LocalKafka, free_port_block
from undertow.infra.broker.certificates import make_certificates
from undertow.infra.broker.resolve import resolve_kafka
from undertow.schemas import Task, encode
from undertow.streams import (CATALOG, KafkaSettings, KafkaUnreachable, RecordConsumer, RecordProducer, Topics,
                     create_topics, list_topics, record_counts)
from tests.helpers import read_all, take, wait_for
from tests.security.helpers import client_certificate, through_worker_to_feed

pytestmark = [pytest.mark.broker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    local = LocalKafka(tmp_path_factory.mktemp("ssl-kafka"), port=free_port_block(2), tls=True).start()
    try:
        yield local
    finally:
        local.stop()


def tls(broker: LocalKafka) -> KafkaSettings:
    """What a user writes in `kafka:`; the CA path is LocalKafka's, everything else spelled out."""
    return KafkaSettings(bootstrap_servers=broker.bootstrap_servers, security_protocol="SSL",
                         ssl_cafile=str(broker.data_dir / "tls" / "ca.pem"))


def read(settings: KafkaSettings, topic: str, group_id: str, want: int) -> list[str]:
    with RecordConsumer(settings, [topic], group_id=group_id, expect=Task, rejected_topic="unused") as c:
        got = take(c, want, 60, f"{want} tasks on {topic} over TLS")
        c.commit()  # the group coordinator is reached over TLS too
    return [d.record.task_id for d in got]


def test_admin_producer_and_consumer_connect_over_tls(broker):
    settings = tls(broker)
    ns = f"tls-{uuid.uuid4().hex[:8]}"
    created = create_topics(settings, ns)
    assert len(created) == len(CATALOG) and list_topics(settings, ns) == created
    tasks = Topics(ns).tasks
    with RecordProducer(settings) as p:
        for i in range(3):
            p.send(tasks, Task(task_id=f"t{i}", prompt="1+1"), partition=0)
    assert read(settings, tasks, f"{ns}-readers", 3) == ["t0", "t1", "t2"]
    assert record_counts(settings, [tasks]) == {tasks: 3}


def test_a_client_without_the_ca_or_without_tls_is_refused_with_a_clear_error(broker, caplog):
    # A short bootstrap timeout keeps the test quick; the default bounds it at 30 s.
    untrusting = KafkaSettings(bootstrap_servers=broker.bootstrap_servers, security_protocol="SSL")
    t0 = time.monotonic()
    with pytest.raises(KafkaUnreachable, match=f"no broker at {broker.bootstrap_servers} accepted a SSL connection"):
        RecordProducer(untrusting, bootstrap_timeout_ms=3000)
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text  # refused for the certificate, not for anything else
    with pytest.raises(KafkaUnreachable, match="accepted a PLAINTEXT connection"):
        RecordConsumer(KafkaSettings(bootstrap_servers=broker.bootstrap_servers), [], group_id=None, expect=Task,
                       rejected_topic="unused", bootstrap_timeout_ms=3000)
    assert time.monotonic() - t0 < 30


def test_faust_gets_the_ca_and_reports_an_untrusted_broker(broker, caplog):
    """Faust hands `broker_credentials` to aiokafka through this function; aiokafka logs why it failed."""
    topic = Topics(f"tls-{uuid.uuid4().hex[:8]}").tasks
    create_topics(tls(broker), topic.split(".")[0])

    async def send(settings: KafkaSettings) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers, request_timeout_ms=5000,
                                    **credentials_to_aiokafka_auth(settings.faust_credentials()))
        try:
            await producer.start()
            await producer.send_and_wait(topic, encode(Task(task_id="f0", prompt="2+2")))
        finally:
            await producer.stop()

    asyncio.run(send(tls(broker)))
    assert read(tls(broker), topic, f"{topic}-readers", 1) == ["f0"]
    untrusting = KafkaSettings(bootstrap_servers=broker.bootstrap_servers, security_protocol="SSL")
    with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
        asyncio.run(send(untrusting))
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text


def test_a_faust_worker_and_the_trainer_intake_connect_from_the_config(broker, tmp_path):
    settings = tls(broker)
    ns = f"tls-{uuid.uuid4().hex[:8]}"
    create_topics(settings, ns)
    batch, _ = through_worker_to_feed(ns, settings, settings, tmp_path)
    assert sorted(i.record.experience_id for i in batch) == ["g0/0", "g0/1"]
    low, high = sorted(batch, key=lambda i: i.record.sample_index)
    assert low.record.advantages[0] < 0 < high.record.advantages[0]  # reshape ran: the worker processed them


def test_sasl_over_tls_logs_in_and_keeps_its_certificates_across_a_restart(tmp_path):
    local = LocalKafka(tmp_path / "kafka", port=free_port_block(2), sasl_users={"alice": "a-pw"}, tls=True).start()
    try:
        ca = local.ca_file.read_bytes()
        local.stop()
        local = LocalKafka(tmp_path / "kafka").start()  # from cluster.json, as the next `undertow broker up`
        assert local.ca_file.read_bytes() == ca  # made once per data directory
        settings = local.settings()
        assert (settings.security_protocol, settings.sasl_username) == ("SASL_SSL", "alice")
        ns = f"tls-{uuid.uuid4().hex[:8]}"
        created = create_topics(settings, ns)
        assert len(created) == len(CATALOG) and list_topics(settings, ns) == created
        wrong = settings.model_copy(update={"sasl_password": "not-hers"})
        with pytest.raises(KafkaUnreachable, match="accepted a SASL_SSL connection as SASL user 'alice'"):
            RecordProducer(wrong, bootstrap_timeout_ms=3000)
    finally:
        local.stop()


def test_a_config_without_a_kafka_section_uses_the_local_brokers_tls(broker, monkeypatch):
    monkeypatch.delenv("UNDERTOW_BOOTSTRAP", raising=False)
    settings = resolve_kafka(KafkaSettings(client_id="me"), broker_dir=broker.data_dir)
    assert (settings.security_protocol, settings.ssl_cafile, settings.client_id) == ("SSL", str(broker.ca_file), "me")
    ns = f"local-tls-{uuid.uuid4().hex[:8]}"
    created = create_topics(settings, ns)  # it connects, over TLS, and the broker does what it is asked
    assert len(created) == len(CATALOG) and list_topics(settings, ns) == created
    spelled_out = resolve_kafka(KafkaSettings(security_protocol="SSL", ssl_cafile="/elsewhere/ca.pem"),
                                broker_dir=broker.data_dir)
    assert spelled_out.ssl_cafile == "/elsewhere/ca.pem"  # what the config says wins


def test_a_broker_that_requires_client_certificates_admits_a_client_with_an_encrypted_key_of_their_ca(tmp_path, caplog):
    """Mutual TLS with the user's own client CA and a key under a password: the admin client and the
    producer present the `kafka:` key. (Every component presents one in test_run_logins.py's run with a
    certificate per component; they all get this one TLS context, whose key loading test_client_settings.py checks.)"""
    trusted = tmp_path / "trusted.pem"  # brokers still trust each other, and now the clients' CA too
    local = LocalKafka(tmp_path / "kafka", port=free_port_block(2), tls=True,
                       extra={"ssl.client.auth": "required", "ssl.truststore.location": str(trusted)})
    make_certificates(local.ca_file.parent)  # the broker's own; start() keeps what it finds
    trusted.write_text(local.ca_file.read_text() + client_certificate(tmp_path, password="s3cret").read_text())
    anonymous = tls(local)
    settings = anonymous.model_copy(update={"ssl_certfile": str(tmp_path / "cert.pem"),
                                            "ssl_keyfile": str(tmp_path / "key.pem"), "ssl_password": "s3cret"})
    local.settings = lambda: settings  # what start() checks readiness with: LocalKafka makes no client keys
    local.start()
    try:
        with pytest.raises(KafkaUnreachable, match="accepted a SSL connection"):
            RecordProducer(anonymous, bootstrap_timeout_ms=3000)
        assert "BAD_CERTIFICATE" in caplog.text  # refused for the missing certificate
        ns = f"mtls-{uuid.uuid4().hex[:8]}"
        assert len(create_topics(settings, ns)) == len(CATALOG)
        tasks = Topics(ns).tasks
        with RecordProducer(settings) as p:
            p.send(tasks, Task(task_id="m0", prompt="1+1"), partition=0)
        assert read(settings, tasks, f"{ns}-readers", 1) == ["m0"]
    finally:
        local.stop()



def test_component_commands_with_no_kafka_section_reach_the_local_tls_broker(broker, tmp_path, monkeypatch):
    """Issue 15: `undertow feed|rollout` re-read the config's (absent) `kafka:` section and spoke
    PLAINTEXT to a `broker up --tls` broker, while trainer and processors got its TLS. Each command
    here finds the local TLS broker from a config with no `kafka:`, and the records go all the way:
    tasks, experiences, processed experiences, a trained step, the archive; then the side consumers
    read them: the evaluator scores the published weights, the watcher reads the experiences, the
    monitor writes the metrics."""
    monkeypatch.delenv("UNDERTOW_BOOTSTRAP", raising=False)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "broker").symlink_to(broker.data_dir)  # the local broker `undertow broker up` leaves
    ns = f"tls-cli-{uuid.uuid4().hex[:6]}"
    topics = Topics(ns)
    create_topics(tls(broker), ns)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({
        "namespace": ns,
        "feeder": {"tasksets": [{"name": "sums", "source": {"name": "sums", "size": 2}}], "epochs": 1, "group_size": 2},
        "rollout": {"engine": {"name": "transformers", "batch_size": 4}, "sampling": {"max_new_tokens": 2},
                    "reward": "numeric_match", "chat_template": False},
        # An untrained model may sample an empty or whitespace-only response, which `clean` rejects by default
        # (CI once saw 3 of 4 reach the ready topic): kept here, so every count below is exact.
        "processors": {"idle_exit_s": 5.0, "pipeline": [{"name": "clean", "empty": "keep"}, "reshape", "prioritize"]},
        "trainer": {"batching": {"experiences": 2, "max_wait_s": 1.0}, "checkpoint_dir": str(tmp_path / "ckpt"),
                    "engine": {"master_port": free_port_block(1)}},
        "archive": {"root": str(tmp_path / "archive"), "topics": ["experiences.raw"]},
        "eval": {"tasksets": [{"name": "held", "source": {"name": "sums", "size": 2, "seed": 9}}]},
        "watchers": ["response_length"],
        "monitor": {"sinks": ["tensorboard"], "dir": str(tmp_path / "tb")}}))
    env = {**os.environ, "UNDERTOW_HOME": str(tmp_path / "home"), "OMP_NUM_THREADS": "1"}
    env.pop("UNDERTOW_BOOTSTRAP", None)
    for command in (["feed", str(config)], ["rollout", str(config), "--max-tasks", "2"], ["process", str(config)],
                    ["train", str(config), "--max-steps", "1"], ["archive", str(config), "--idle-timeout", "3"]):
        out = subprocess.run([sys.executable, "-m", "undertow.infra.cli", *command], cwd=ROOT, env=env, capture_output=True,
                             text=True, timeout=300)
        assert out.returncode == 0, (command, out.stdout[-2000:], out.stderr[-2000:])
    counts = record_counts(tls(broker), [topics.tasks, topics.raw, topics.ready, topics.rejected])
    rejected = [(r.stage, r.reason, r.detail) for r in read_all(tls(broker), topics.rejected)] if counts[topics.rejected] else []
    assert counts == {topics.tasks: 2, topics.raw: 4, topics.ready: 4, topics.rejected: 0}, (counts, rejected)
    assert "archived 4 rows" in out.stdout, out.stdout

    side = {name: subprocess.Popen([sys.executable, "-m", "undertow.infra.cli", name, str(config)], cwd=ROOT, env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for name in ("eval", "watch")}
    wait_for(lambda: record_counts(tls(broker), [topics.evals])[topics.evals] > 0, 240, "an evaluation over TLS",
             proc=side["eval"], every=1)
    for proc in side.values():
        proc.terminate()
    results = {name: proc.communicate(timeout=120) + (proc.returncode,) for name, proc in side.items()}
    assert results["eval"][2] == 0 and "evaluated" in results["eval"][0], results["eval"]
    assert results["watch"][2] == 0 and "watcher response_length: 4 records" in results["watch"][0], results["watch"]
    out = subprocess.run([sys.executable, "-m", "undertow.infra.cli", "monitor", str(config), "--idle-timeout", "5"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and " 0 metric events" not in out.stdout and "metric events" in out.stdout, out
