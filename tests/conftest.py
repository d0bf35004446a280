"""Session-wide fixtures: one real Apache Kafka broker for every integration test."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import sys
import tempfile
import threading
import uuid
from pathlib import Path

import pytest

from undertow.infra.broker.local import LocalKafka, free_port_block
from undertow.infra.run.runner import latest_export
from undertow.streams import BOOTSTRAP_ENV, KafkaSettings, create_topics
from tests.run_output import DemoRun, demo_config, only_run_dir, undertow_run, wait_run
from tests.turns import DEMO_MADE, order, shared_dir

os.environ.setdefault("OMP_NUM_THREADS", "1")
# The tests' brokers (and those of the runs they start) live seconds to minutes: the JIT's first tier
# alone starts one with ~40% less CPU (2.4-2.7 s against 4.2-4.3 s, tests/infra/test_broker_props.py).
os.environ.setdefault("KAFKA_OPTS", "-XX:TieredStopAtLevel=1")
BROKER_FIXTURES = {"kafka", "broker", "cluster"}  # the session's broker, the TLS / SASL ones, the 3-node cluster


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (`-n 3`) the controller starts the broker its workers share: they inherit
    $UNDERTOW_BOOTSTRAP, and the demo run's topics are there for whichever worker reads them."""
    if getattr(config.option, "maxschedchunk", 0) is None:
        config.option.maxschedchunk = 1  # a worker holds one test besides the one it runs (tests/turns.py)
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput") \
            and not os.environ.get(BOOTSTRAP_ENV):
        config._undertow_broker = LocalKafka(Path(tempfile.mkdtemp(prefix="undertow-tests-kafka-")),
                                             port=free_port_block(2)).start()
        os.environ[BOOTSTRAP_ENV] = config._undertow_broker.bootstrap_servers


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory):
    """Settings for a real broker: $UNDERTOW_BOOTSTRAP if set, else a KRaft node started here."""
    if os.environ.get(BOOTSTRAP_ENV):
        yield KafkaSettings().with_env()
        return
    broker = LocalKafka(tmp_path_factory.mktemp("kafka"), port=free_port_block(2)).start()
    os.environ[BOOTSTRAP_ENV] = broker.bootstrap_servers  # subprocesses (CLI, Faust workers) find it too
    try:
        yield KafkaSettings(bootstrap_servers=broker.bootstrap_servers)
    finally:
        os.environ.pop(BOOTSTRAP_ENV, None)
        broker.stop()


@pytest.fixture
def namespace(kafka: KafkaSettings, request: pytest.FixtureRequest) -> str:
    """A fresh namespace with the whole topic catalog created, one per test."""
    ns = f"t-{request.node.name[:40].replace('[', '-').replace(']', '')}-{uuid.uuid4().hex[:6]}"
    ns = "".join(c if c.isalnum() or c in "-_" else "-" for c in ns)
    create_topics(kafka, ns)
    return ns


@pytest.fixture(scope="session")
def demo(kafka: KafkaSettings, pytestconfig: pytest.Config) -> DemoRun:
    """`undertow run examples/demo.yaml`, once per session (~4 min) on the session's broker: its topics
    stay up after it for the README's `undertow tail` and `replay` (the demo's own broker stops with it).
    Under pytest-xdist the first worker to need it runs it, and the others wait for it and read it."""
    shared = shared_dir(pytestconfig)
    with open(shared / "demo.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / DEMO_MADE
        if done.exists():
            found = json.loads(done.read_text())
            return DemoRun(Path(found["run_dir"]), found["out"])
        tmp_path = Path(tempfile.mkdtemp(prefix="demo", dir=shared))
        proc = undertow_run(str(demo_config(tmp_path)), "--runs-dir", str(tmp_path / "runs"))
        out = wait_run(proc, tmp_path / "runs", timeout=540)  # its tests have 900 s: a second one waits for it
        run = DemoRun(only_run_dir(tmp_path / "runs"), out)
        done.write_text(json.dumps({"run_dir": str(run.run_dir), "out": out}))
        return run


@pytest.fixture(scope="session")
def demo_warm_start(demo: DemoRun) -> Path:
    """The HF export the demo's SFT warm-up ended with: where the fault tests start RL from."""
    return latest_export(demo.run_dir / "checkpoints" / "demo-warmup")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that reaches the broker says so (`-m "not broker"` must leave it out): refuse to run
    a suite in which one does not. Then the order the workers take the tests in (tests/turns.py)."""
    unmarked = [item.nodeid for item in items if BROKER_FIXTURES & set(getattr(item, "fixturenames", ()))
                and item.get_closest_marker("broker") is None]
    if unmarked:
        raise pytest.UsageError(f"tests that use the broker without the `broker` marker: {unmarked}")
    order(config, items)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook; the vLLM environment runs its tests without it
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    from tests.scheduling import TurnScheduling

    return TurnScheduling(config, log)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config._undertow_exitstatus = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """A thread a failed test left running (a worker waiting for a task that never came) would keep
    the interpreter from exiting, and CI would wait for it until its own timeout: name it, and leave."""
    broker = getattr(config, "_undertow_broker", None)
    if broker is not None:
        broker.stop()
        shutil.rmtree(broker.data_dir, ignore_errors=True)
    stuck = [t for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive() and not t.daemon]
    if stuck:
        print(f"\nnon-daemon threads still running after the session: {[t.name for t in stuck]}; exiting "
              "without waiting for them", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(getattr(config, "_undertow_exitstatus", 1))
