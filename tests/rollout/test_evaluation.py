"""Held-out evaluation: pass@k by hand, the evaluator on the tiny model, and `undertow eval` following
the weights topic of the real broker."""

from __future__ import annotations

import threading

import pytest
import torch

from undertow.kernel.models import ModelSpec, build_model, weights_to_bytes
from undertow.infra.run.config import RunConfig
from undertow.rollout.engines import build_engine
from undertow.rollout.eval_runner import follow
from undertow.rollout.evaluation import Evaluator, pass_at_k
from undertow.schemas import EvalResult, MetricEvent, chunk_weights
from undertow.streams import RecordProducer, RunContext, Topics
from undertow.streams.weights import publish_weights

from tests.helpers import read_all, wait_for

HELDOUT = {"tasksets": [{"name": "sums-heldout", "source": {"name": "sums", "size": 24, "seed": 7}}]}


def config(**eval_section) -> RunConfig:
    return RunConfig.model_validate({
        "namespace": "ev", "rollout": {"chat_template": False, "sampling": {"max_new_tokens": 3},
                                       "reward": "tests.rollout.plugins.sevens"},
        "eval": {**HELDOUT, **eval_section}})


def test_pass_at_k_by_hand():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)  # 1 − C(3,2)/C(5,2)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(2, 1, 3)


def seven_model() -> torch.nn.Module:
    """The tiny model made to say 7: the last layer norm outputs c · e₇ everywhere (weight 0, bias c · e₇),
    so the tied head scores token t as c · e_t · e₇, largest for 7 once e₇ is the longest embedding."""
    from undertow.kernel.models import build_tokenizer

    model = build_model(ModelSpec())
    seven = build_tokenizer(ModelSpec())("7")["input_ids"][0]
    with torch.no_grad():
        wte = model.transformer.wte.weight
        wte[seven] *= 3.0
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.copy_(1000.0 * wte[seven])
    return model


def test_greedy_accuracy_and_pass_at_k_of_the_tiny_model():
    cfg = config(samples=4)
    engine = build_engine(cfg.rollout.engine, cfg.model)
    evaluator = Evaluator(engine, cfg.rollout, cfg.eval, "tiny")
    (before,) = evaluator.evaluate(0)
    assert before.tasks == 24 and before.greedy_accuracy < 0.2 and set(before.pass_at) == {"pass@1", "pass@4"}
    engine.load_weights(weights_to_bytes(seven_model()))
    (after,) = evaluator.evaluate(1)
    assert after.greedy_accuracy == 1.0 and after.pass_at["pass@4"] >= after.pass_at["pass@1"] > 0.5
    assert evaluator.evaluate(1)[0].greedy_accuracy == after.greedy_accuracy  # greedy is deterministic


def test_a_taskset_without_answers_is_refused(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"prompt": "say hi"}\n')
    cfg = RunConfig.model_validate({"eval": {"tasksets": [{"name": "open", "source": {"name": "jsonl",
                                                                                       "path": str(path)}}]}})
    with pytest.raises(ValueError, match="eval.tasksets 'open'.*no answer"):
        Evaluator(build_engine("transformers", cfg.model), cfg.rollout, cfg.eval, "tiny")


@pytest.mark.broker
def test_undertow_eval_follows_the_weights_topic(kafka, namespace):
    cfg = config(every=5)
    context = RunContext(namespace=namespace, kafka=kafka, model=cfg.model)
    topics = Topics(namespace)
    stop = threading.Event()
    done: list[int] = []
    runner = threading.Thread(target=lambda: done.extend(follow(cfg.eval, cfg.rollout, context, stop)), daemon=True)
    runner.start()
    publish = lambda version, model: publish_weights(producer, topics.weights, chunk_weights(
        cfg.model.name, version, weights_to_bytes(model), 1 << 20))
    try:
        with RecordProducer(kafka) as producer:
            wait_for_versions(kafka, topics, {0})  # the weights it starts from, before any update
            publish(3, build_model(ModelSpec()))  # not a multiple of 5: skipped
            publish(5, seven_model())
            wait_for_versions(kafka, topics, {0, 5})
            publish(7, seven_model())  # the last version: scored when the evaluator stops, however soon after
    finally:
        stop.set()
    runner.join(60)
    assert done == [0, 5, 7]
    results = {r.version: r for r in read_all(kafka, topics.evals, expect=EvalResult)}
    assert sorted(results) == [0, 5, 7] and results[5].greedy_accuracy == 1.0 > results[0].greedy_accuracy
    events = [m for m in read_all(kafka, topics.metrics, expect=MetricEvent) if m.component == "eval"]
    assert [m.step for m in events] == [0, 5, 7] and events[1].values["sums-heldout/greedy_accuracy"] == 1.0



@pytest.mark.broker
def test_an_evaluator_started_late_still_scores_the_starting_weights(kafka, namespace):
    # The trainer may publish before the evaluator is up (a slow start, a restart): the curve keeps
    # its origin, version 0, and then goes on from the newest version.
    cfg = config(every=5)
    context = RunContext(namespace=namespace, kafka=kafka, model=cfg.model)
    topics = Topics(namespace)
    with RecordProducer(kafka) as producer:
        publish_weights(producer, topics.weights, chunk_weights(cfg.model.name, 5, weights_to_bytes(seven_model()), 1 << 20))
    stop = threading.Event()
    done: list[int] = []
    runner = threading.Thread(target=lambda: done.extend(follow(cfg.eval, cfg.rollout, context, stop)), daemon=True)
    runner.start()
    try:
        wait_for_versions(kafka, topics, {0, 5})
    finally:
        stop.set()
    runner.join(60)
    assert done == [0, 5]


def wait_for_versions(kafka, topics: Topics, versions: set[int], timeout: float = 60.0) -> None:
    evaluated = lambda: {r.version for r in read_all(kafka, topics.evals, expect=EvalResult)}
    wait_for(lambda: versions <= evaluated(), timeout, f"versions {sorted(versions)} evaluated",
             state=lambda: f"versions evaluated: {sorted(evaluated())}", every=0.5)
