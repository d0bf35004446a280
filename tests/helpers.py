"""Record factories and helpers shared by the tests: one copy of each, imported where needed."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import yaml
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError

from undertow.schemas import Experience, Record, Task, decode
from undertow.streams import KafkaSettings, RecordConsumer, RecordProducer, RunContext
from undertow.streams.admin import admin_client
from undertow.streams.connect import connect
from undertow.streams.consumer import read_messages, read_to_end

ROOT = Path(__file__).resolve().parents[1]


# -- records -----------------------------------------------------------------------------------

def exp(group: str = "g", index: int = 0, size: int = 4, reward: float | None = 1.0, text: str = "ok",
        tokens: int = 3, finish: str = "stop", version: int = 0, task: str | None = None, **kw) -> Experience:
    """Sample `index` of prompt group `group`, as a rollout worker publishes it (no advantages yet)."""
    return Experience(experience_id=f"{group}/{index}", task_id=task or group, group_id=group, group_size=size,
                      sample_index=index, prompt_text="p", prompt_tokens=[1, 2], response_text=text,
                      response_tokens=list(range(5, 5 + tokens)), reward=reward, policy_version=version,
                      finish_reason=finish, **kw)


def group(name: str, rewards: list[float | None], **kw) -> list[Experience]:
    """A whole prompt group, sample i with rewards[i]."""
    return [exp(name, i, len(rewards), r, text=f"answer {i}", **kw) for i, r in enumerate(rewards)]


def trainable(group: str, index: int, size: int = 2, *, tokens: int = 3, **kw) -> Experience:
    """An experience as the trainer receives it: behaviour log-probs and an advantage on every token."""
    return exp(group, index, size, tokens=tokens, behaviour_logprobs=[-1.0] * tokens, advantages=[1.0] * tokens, **kw)


# -- topics and configs ------------------------------------------------------------------------

def produce(kafka: KafkaSettings, topic: str, records: list[Record], key_of=lambda r: r.group_id) -> None:
    """Send `records` to `topic`, keyed like the stage that makes them (a group per partition); flushed."""
    with RecordProducer(kafka) as producer:
        for r in records:
            producer.send(topic, r, key=key_of(r))


def read_all(kafka: KafkaSettings, topic: str, expect: type[Record] | tuple | None = None) -> list:
    """Every record on `topic` now (decoded and validated as `expect`), in partition order."""
    return [decode(value, expect=expect) for value in read_to_end(kafka, topic)]


def read_again(kafka: KafkaSettings, group: str, topic: str) -> dict[int, range]:
    """Per partition, the offsets a member of `group` killed now may have handled without committing
    them: from the group's committed offset to the partition's end now. At-least-once delivery reads
    them again; no other record may be handled twice."""
    consumer = connect(KafkaConsumer, kafka, group_id=group, enable_auto_commit=False)
    try:
        partitions = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic)]
        ends = consumer.end_offsets(partitions)
        return {tp.partition: range(consumer.committed(tp) or 0, ends[tp]) for tp in partitions}
    finally:
        consumer.close()


def experience_ids_at(kafka: KafkaSettings, topic: str, offsets: dict[int, range]) -> set[str]:
    """The experience ids of the records of `topic` at those offsets."""
    return {decode(m.value, expect=Experience).experience_id for m in read_messages(kafka, topic)
            if m.offset in offsets.get(m.partition, ())}


def raw_assignment(kafka: KafkaSettings, group: str, raw: str) -> list[set[int]]:
    """The raw partitions each member of the group holds now (one set per member), sorted by size."""
    try:
        with admin_client(kafka) as admin:
            desc = admin.describe_groups([group])[group]
    except KafkaError:  # no coordinator yet (a fresh broker makes its offsets topic on first use)
        return []
    if desc.get("error") or desc.get("group_state") != "Stable":
        return []
    held = []
    for member in desc["members"]:
        assignment = member.get("member_assignment") or {}  # decoded: Faust's assignor uses the standard layout
        held.append({p for t in assignment.get("assigned_partitions", ()) if t["topic"] == raw
                     for p in t["partitions"]})
    return sorted(held, key=len)


def write_config(path: Path, namespace: str, **sections: Any) -> Path:
    """A run config at `path`: the namespace, the tiny model unless `model` is given, and `sections`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"namespace": namespace, "model": {"source": "tiny"}, **sections}))
    return path


def load_run(path: Path, kafka: KafkaSettings | None = None) -> tuple[Any, RunContext]:
    """What a component command makes of the config at `path`: the run config, and the context its
    component is given, on the test cluster `kafka`."""
    from undertow.infra.run.config import load_component_config

    cfg = load_component_config(path)
    return cfg, RunContext(namespace=cfg.namespace, kafka=kafka or cfg.kafka, model=cfg.model)


# -- waiting and processes ---------------------------------------------------------------------

def wait_for(predicate: Callable[[], Any], timeout: float = 60.0, what: str = "", *, proc: subprocess.Popen | None = None,
             state: Callable[[], Any] | None = None, every: float = 0.2) -> Any:
    """The first truthy value of `predicate()`. A wait ends on a condition, never after a duration; when
    `timeout` s pass first, or `proc` exits, it fails saying `what` it waited for (every call names it:
    tests/test_suite_rules.py), the predicate's last value, and `state()`: what the system held at that
    moment (group members, offsets, a log's tail)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        exited = proc is not None and proc.poll() is not None
        if exited or time.monotonic() >= deadline:
            why = f"process exited ({proc.returncode})" if exited else f"timed out after {timeout:.0f} s"
            held = f"\nthe system held: {describe(state)}" if state is not None else ""
            output = f"\nits output:\n{proc.communicate()[0][-5000:]}" if exited and proc.stdout else ""
            raise AssertionError(f"{why} waiting for {what}; last value {value!r:.500}{held}{output}")
        time.sleep(every)


def take(consumer: Any, want: int, timeout: float = 60.0, what: str = "", *,
         proc: subprocess.Popen | None = None, log: Path | None = None) -> list:
    """The next `want` (or more) deliveries of a RecordConsumer, polled as they come; fails naming
    `what` it waited for, how many had arrived and the end of `log` (the producing process's)."""
    got: list = []
    tail = lambda: f"; {log.name}:\n{log.read_text(errors='replace')[-3000:]}" if log and log.exists() else ""
    wait_for(lambda: got.extend(consumer.poll(timeout_ms=500)) or len(got) >= want, timeout,
             what or f"{want} records", proc=proc, state=lambda: f"{len(got)} of {want} arrived{tail()}", every=0)
    return got


def holds_for(predicate: Callable[[], Any], seconds: float, what: str, every: float = 0.1) -> None:
    """Assert that `predicate()` stays true for `seconds`: the one honest use of a duration in a test,
    checking that something does not happen (a paused feeder publishes nothing more)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert predicate(), f"{what} stopped holding after {seconds - (deadline - time.monotonic()):.1f} s"
        time.sleep(every)
    assert predicate(), f"{what} stopped holding at {seconds:.1f} s"


def describe(state: Callable[[], Any]) -> str:
    """`state()` for a failure message; a probe that fails itself says how, instead of hiding the timeout."""
    try:
        return str(state())[-5000:]
    except Exception as e:  # noqa: BLE001 - the timeout is the failure to report, not the probe's
        return f"(could not be read: {type(e).__name__}: {e})"


def env(**extra: str) -> dict[str, str]:
    """Environment of a child process, read when a test runs (the broker fixture exports $UNDERTOW_BOOTSTRAP).
    PYTHONFAULTHANDLER: a hung child killed with SIGABRT prints where every thread was."""
    return dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONFAULTHANDLER="1", **extra)


def cli(*args: str, timeout: float = 120, **extra_env: str) -> subprocess.CompletedProcess:
    """Run `undertow …` as a subprocess; fails the test with its output when it fails."""
    done = subprocess.run([sys.executable, "-m", "undertow.infra.cli", *args], env=env(**extra_env), cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-5000:]
    return done


def start_cli(*args: str, **extra_env: str) -> subprocess.Popen:
    """Start `undertow …`; its output (stdout and stderr together) is the Popen's stdout."""
    return subprocess.Popen([sys.executable, "-m", "undertow.infra.cli", *args], env=env(**extra_env), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


class Sending:
    """Tasks sent to `topic` one at a time on a thread, each waited for, with the product's producer
    (acks=all, idempotent): what the brokers acknowledged and what failed, while a test breaks things.

        with Sending(kafka, topic) as sends:
            sends.more(100, "before the fault")
            ...                                   # the fault
            sends.more(100, "during the fault")   # one stuck send stops them all: progress means recovery
        sends.check_read_back(kafka)              # every acknowledged task once, nothing never sent
    """

    def __init__(self, kafka: KafkaSettings, topic: str):
        self.kafka, self.topic = kafka, topic
        self.acked: list[str] = []
        self.failed: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._send, daemon=True)

    def _send(self) -> None:
        with RecordProducer(self.kafka, request_timeout_ms=10000) as p:
            i = 0
            while not self._stop.is_set():
                tid = f"t{i}"
                try:
                    p.send(self.topic, Task(task_id=tid, prompt="2+2"), key=tid).get(timeout=120)
                    self.acked.append(tid)
                except Exception:  # noqa: BLE001 — an unacknowledged send may be lost; that is allowed
                    self.failed.append(tid)
                i += 1

    def more(self, n: int, what: str, timeout: float = 180) -> None:
        want = len(self.acked) + n
        wait_for(lambda: len(self.acked) >= want, timeout, f"{n} more acknowledged sends {what}", every=0.05,
                 state=lambda: f"{len(self.acked)} acknowledged, {len(self.failed)} failed")

    def __enter__(self) -> "Sending":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(150)

    def check_read_back(self, kafka: KafkaSettings) -> None:
        """Every acknowledged task is on the topic, once; nothing is there that was never sent."""
        delivered: list[str] = []
        acked = set(self.acked)
        with RecordConsumer(kafka, [self.topic], group_id=None, expect=Task, rejected_topic="unused") as c:
            wait_for(lambda: delivered.extend(d.record.task_id for d in c.poll(timeout_ms=500)) or acked <= set(delivered),
                     120, "every acknowledged send read back", every=0,
                     state=lambda: f"{len(acked - set(delivered))} of {len(acked)} acknowledged not read yet")
            delivered += [d.record.task_id for d in c.poll(timeout_ms=2000)]
        seen = set(delivered)
        assert acked <= seen, f"lost {len(acked - seen)} acknowledged records"
        assert len(delivered) == len(seen), "the idempotent producer wrote a record twice"
        assert seen <= acked | set(self.failed), "a record on the topic that was never sent"
