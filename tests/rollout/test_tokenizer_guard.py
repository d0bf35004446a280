"""The run-time guard against an engine and a trainer that tokenize differently, on the real broker:
the trainer's weights sender stamps its tokenizer's fingerprint on every announcement; a rollout worker
with the same tokenizer takes the weights, one with another stops before generating (at start, or
at the first such announcement), and so does the evaluator, each with the reason on the rejected
topic."""

from __future__ import annotations

import threading

import pytest

from undertow.kernel.models import ModelSpec, TokenizerMismatch, build_model, build_tokenizer, fingerprint
from undertow.kernel.models.weights import state_tensors
from undertow.rollout.eval_runner import follow
from undertow.rollout.worker import RolloutWorker
from undertow.schemas import Experience, Rejected, Task, WeightUpdate
from undertow.streams import RecordProducer, RunContext, Topics
from undertow.streams.weights import Sending, WeightsConfig, build_sender
from tests.helpers import load_run, read_all, wait_for
from tests.hostile.helpers import train_ids, trainer_intake
from tests.trainer.helpers import make_group
from tests.rollout.test_evaluation import config as eval_config

pytestmark = [pytest.mark.broker]

ROLLOUT = {"sampling": {"max_new_tokens": 4}, "workflow": "single_turn", "reward": "numeric_match",
           "max_staleness": 4}


def trainers_tokenizer(eos: str | None = None) -> str:
    """The fingerprint a trainer publishes: the tiny model's, or with another EOS (a trainer that
    reads the ids otherwise)."""
    tok = build_tokenizer(ModelSpec())
    if eos:
        tok.eos_token = eos
    return fingerprint(tok)


def publish(kafka, topics: Topics, version: int, tokenizer: str) -> None:
    with RecordProducer(kafka) as producer:
        sender = build_sender(Sending("policy", WeightsConfig(chunk_bytes=1 << 20), producer, topics, "full", kafka,
                                      tokenizer))
        sender.publish(version, sender.pack(state_tensors(build_model(ModelSpec(seed=version))), None))


def ask(kafka, topics: Topics, task_id: str) -> None:
    with RecordProducer(kafka) as producer:
        producer.send(topics.tasks, Task(task_id=task_id, prompt="What is 2+3?", answer="5", group_size=2), key=task_id)


def test_a_worker_generates_for_its_own_tokenizer_and_stops_at_another(kafka, namespace, config_path):
    config, context = load_run(config_path(rollout=ROLLOUT), kafka)
    topics = Topics(namespace)
    publish(kafka, topics, 1, trainers_tokenizer())
    assert {u.tokenizer for u in read_all(kafka, topics.weights, expect=WeightUpdate)} == {trainers_tokenizer()}
    worker = RolloutWorker(config.rollout, context, "w0")
    outcome: dict = {}

    def work() -> None:
        try:
            outcome["stats"] = worker.run()
        except TokenizerMismatch as e:
            outcome["error"] = e

    thread = threading.Thread(target=work, daemon=True)
    thread.start()
    ask(kafka, topics, "t1")
    first = wait_for(lambda: [e for e in read_all(kafka, topics.raw, Experience) if e.task_id == "t1"],
                     what="t1 generated on v1")
    assert {e.policy_version for e in first} == {1}  # the same tokenizer: weights taken
    assert {e.metadata["tokenizer"] for e in first} == {trainers_tokenizer()}  # what the trainer checks

    publish(kafka, topics, 2, trainers_tokenizer(eos="<pad>"))
    thread.join(timeout=60)
    assert not thread.is_alive() and "stats" not in outcome
    assert "is not this engine's" in str(outcome["error"]) and worker.subscriber.refused == [2]
    ask(kafka, topics, "t2")
    refused = [r for r in read_all(kafka, topics.rejected, Rejected) if r.stage == "weights"]
    assert [r.reason for r in refused] == ["tokenizer_mismatch"] and "policy@v2" in refused[0].record_id

    # A new worker finds v2 on the compacted topic and refuses to start: t2 is never generated.
    late = RolloutWorker(config.rollout, context, "w1")
    with pytest.raises(TokenizerMismatch, match="fingerprint"):
        late.run(idle_timeout=5)
    assert late.stats.tasks == 0 and not [e for e in read_all(kafka, topics.raw, Experience) if e.task_id == "t2"]


def test_the_trainer_refuses_experiences_of_another_tokenizer(kafka, namespace):
    topics = Topics(namespace)
    ours, theirs = trainers_tokenizer(), trainers_tokenizer(eos="<pad>")
    with RecordProducer(kafka) as producer:
        for group, stamp in (("ours", ours), ("theirs", theirs)):
            for exp in make_group(group, size=2):
                exp = exp.model_copy(update={"metadata": {"tokenizer": stamp}})
                producer.send(topics.ready, exp, key=exp.group_id)
        producer.flush()
        feed = trainer_intake(kafka, topics, producer, checks_staleness=True, experiences=2, tokenizer=ours)
        trained = train_ids(feed)
        feed.close()
    assert sorted(trained) == ["ours/0", "ours/1"]
    refused = [r for r in read_all(kafka, topics.rejected, Rejected) if r.stage == "trainer"]
    assert sorted((r.record_id, r.reason) for r in refused) == [("theirs/0", "tokenizer_mismatch"),
                                                               ("theirs/1", "tokenizer_mismatch")]


def test_the_evaluator_stops_at_another_tokenizer(kafka, namespace):
    cfg = eval_config()
    context = RunContext(namespace=namespace, kafka=kafka, model=cfg.model)
    publish(kafka, context.topics, 3, trainers_tokenizer(eos="<pad>"))
    with pytest.raises(TokenizerMismatch, match="is not this engine's"):
        follow(cfg.eval, cfg.rollout, context, threading.Event())
