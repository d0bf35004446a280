"""Every client logs in with the `kafka:` settings, against a broker of its own that requires SASL/PLAIN."""

from __future__ import annotations

import asyncio
import subprocess
import uuid

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaConnectionError
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from undertow.infra.broker.local import LocalKafka, free_port_block
from undertow.schemas import Task
from undertow.streams import (CATALOG, KafkaSettings, KafkaUnreachable, RecordConsumer, RecordProducer, Topics,
                     create_topics, list_topics, record_counts)
from tests.helpers import take
from tests.security.helpers import run_config, through_worker_to_feed, undertow

pytestmark = [pytest.mark.broker, pytest.mark.slow]
USERS = {"alice": "alice-secret", "bob": "bob-secret"}


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory):
    local = LocalKafka(tmp_path_factory.mktemp("sasl-kafka"), port=free_port_block(2), sasl_users=USERS).start()
    try:
        yield local
    finally:
        local.stop()


def login(broker: LocalKafka, user: str, password: str | None = None) -> KafkaSettings:
    return KafkaSettings(bootstrap_servers=broker.bootstrap_servers, security_protocol="SASL_PLAINTEXT",
                         sasl_mechanism="PLAIN", sasl_username=user, sasl_password=password or USERS[user])


def fresh_namespace(settings: KafkaSettings) -> str:
    ns = f"sec-{uuid.uuid4().hex[:8]}"
    create_topics(settings, ns)
    return ns


def test_admin_producer_and_consumer_log_in_as_the_configured_user(broker):
    alice, bob = login(broker, "alice"), login(broker, "bob")
    ns = f"sec-{uuid.uuid4().hex[:8]}"
    created = create_topics(alice, ns)
    assert len(created) == len(CATALOG) and list_topics(bob, ns) == created
    tasks = Topics(ns).tasks
    with RecordProducer(alice) as p:
        for i in range(3):
            p.send(tasks, Task(task_id=f"t{i}", prompt="1+1"), partition=0)
    with RecordConsumer(bob, [tasks], group_id=f"{ns}-readers", expect=Task, rejected_topic=Topics(ns).rejected) as c:
        got = take(c, 3, 60, "bob reading alice's 3 tasks")
        c.commit()  # the group coordinator takes bob's login too
    assert [d.record.task_id for d in got] == ["t0", "t1", "t2"]
    assert record_counts(bob, [tasks]) == {tasks: 3}


def test_a_wrong_password_or_no_login_fails_with_a_clear_error(broker):
    wrong = login(broker, "alice", "not-her-password")
    # A short bootstrap timeout keeps the test quick; the default bounds it at 30 s.
    with pytest.raises(KafkaUnreachable) as err:
        RecordProducer(wrong, bootstrap_timeout_ms=3000)
    assert (f"no broker at {broker.bootstrap_servers} accepted a SASL_PLAINTEXT connection as SASL user 'alice'"
            in str(err.value)) and "credentials" in str(err.value)
    assert isinstance(err.value, RuntimeError)  # the CLI prints it as one line, exit code 2
    with pytest.raises(KafkaUnreachable, match="accepted a PLAINTEXT connection"):
        RecordConsumer(KafkaSettings(bootstrap_servers=broker.bootstrap_servers), [], group_id=None, expect=Task,
                       rejected_topic="unused", bootstrap_timeout_ms=3000)


def test_faust_gets_the_login_and_reports_a_refused_one(broker, caplog):
    """Faust hands `broker_credentials` to aiokafka through this function; aiokafka logs why it failed."""
    async def start(settings: KafkaSettings) -> None:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap_servers,
                                    **credentials_to_aiokafka_auth(settings.faust_credentials()))
        try:
            await producer.start()
        finally:
            await producer.stop()

    asyncio.run(start(login(broker, "bob")))
    with pytest.raises(KafkaConnectionError, match="Unable to bootstrap"):
        asyncio.run(start(login(broker, "bob", "wrong")))
    assert "SaslAuthenticationFailed: Authentication failed: Invalid username or password" in caplog.text


def test_a_faust_worker_and_the_trainer_intake_log_in_from_the_config(broker, tmp_path):
    alice, bob = login(broker, "alice"), login(broker, "bob")
    ns = fresh_namespace(alice)
    batch, committed = through_worker_to_feed(ns, alice, bob, tmp_path)
    assert sorted(i.record.experience_id for i in batch) == ["g0/0", "g0/1"]
    low, high = sorted(batch, key=lambda i: i.record.sample_index)
    assert low.record.advantages[0] < 0 < high.record.advantages[0]  # reshape ran: the worker processed them
    assert sum(committed.values()) == 2  # bob's commit reached the group coordinator


def test_the_feeder_cli_logs_in_from_the_config(broker, tmp_path):
    alice = login(broker, "alice")
    ns = fresh_namespace(alice)
    feeder = {"tasksets": [{"name": "a", "source": {"name": "arithmetic", "size": 4}}], "group_size": 2}
    config = run_config(tmp_path, ns, alice, feeder=feeder)
    out = subprocess.run(**undertow("feed", config=config, tmp_path=tmp_path, capture_output=True, text=True,
                                    timeout=300))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "4 task(s) published" in out.stdout
    assert record_counts(login(broker, "bob"), [Topics(ns).tasks]) == {Topics(ns).tasks: 4}
