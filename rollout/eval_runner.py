"""`undertow eval`: follow `<ns>.weights` and score held-out tasksets on every `eval.every`-th policy
version, version 0 (the weights the run starts from) and the last; results go to
`<ns>.evals` (one EvalResult per taskset) and, as one metric event of component `eval`, to
`<ns>.metrics`. It is a side consumer: it reads the weights from the topic's start without a
consumer group, so it neither slows the trainer nor takes anything from the rollout workers.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from undertow.schemas import EvalResult, MetricEvent
from undertow.streams import RecordProducer, RunContext, Topics

from undertow.kernel.models import ModelSpec, fingerprint
from undertow.rollout.config import EvalConfig, RolloutConfig, TasksetConfig
from undertow.rollout.contamination import shares
from undertow.rollout.engines import build_engine
from undertow.rollout.evaluation import Evaluator, metric_values
from undertow.rollout.weight_subscriber import WeightSubscriber

log = logging.getLogger(__name__)
COMPONENT = "eval"
CATCH_UP_S = 30.0


def follow(cfg: EvalConfig, rollout: RolloutConfig, run: RunContext, stop: threading.Event,
           training: list[TasksetConfig] | None = None) -> list[int]:
    """Evaluate versions as the trainer publishes them, until `stop`; returns the versions evaluated.
    `rollout` gives the engine, the reward and the prompt form; `training`, the feeder's tasksets, what
    each held-out taskset's contamination is measured against (reported with every evaluation)."""
    topics = run.topics  # a shadow's evaluator follows the shadow's weights and writes its own evals
    shared = contamination_values(cfg, training or [])
    evaluator = Evaluator(build_engine(rollout.engine, run.model), rollout, cfg, run.model.name)
    producer = RecordProducer(run.kafka)
    # A side consumer: it takes a broadcast version from its files, never slowing the trainer's group.
    subscriber = WeightSubscriber(run.kafka, topics, run.model.name, producer, join_broadcast=False,
                                  tokenizer=fingerprint(evaluator.engine.tokenizer))
    subscriber.start()
    # The engine holds the weights the run starts from: scored before anything is loaded, however
    # late this process starts (a restarted evaluator scores them again), so every curve has its origin.
    held = 0
    try:
        publish(producer, topics, evaluator.evaluate(held), shared)
        done = [held]
        subscriber.caught_up.wait(CATCH_UP_S)  # then the newest version already published
        while True:
            subscriber.check()  # scores of a model that reads its prompts otherwise would mislead
            stopping = stop.is_set()
            if stopping and not subscriber.settle(CATCH_UP_S):
                log.warning("eval: the weights topic was not read to its end in %.0f s; scoring v%d as the last",
                            CATCH_UP_S, held)
            ready = subscriber.take()
            if ready is not None and subscriber.load(ready, evaluator.engine) is not None:
                held = ready.version
            if held != done[-1] and (held % cfg.every == 0 or stopping):
                publish(producer, topics, evaluator.evaluate(held), shared)
                done.append(held)
            if stopping:
                return done
            stop.wait(0.2)
    finally:
        subscriber.stop()
        producer.flush()
        producer.close()


def contamination_values(cfg: EvalConfig, training: list[TasksetConfig]) -> dict[str, float]:
    """`<taskset>/contamination`: the share of each held-out taskset's prompts that training can draw."""
    values = {f"{t.name}/contamination": share for t, share in shares(cfg.tasksets, cfg.max_tasks, training)}
    for name, share in values.items():
        log.info("eval %s: %.1f%% of its prompts are training prompts too", name.split("/")[0], 100 * share)
    return values


def publish(producer: RecordProducer, topics: Topics, results: list[EvalResult],
            extra: dict[str, float] | None = None) -> None:
    for r in results:
        producer.send(topics.evals, r, key=r.taskset)
        log.info("eval v%d %s: greedy accuracy %s, %s, mean reward %.3f", r.version, r.taskset,
                 "—" if r.greedy_accuracy is None else f"{r.greedy_accuracy:.3f}",
                 ", ".join(f"{k} {v:.3f}" for k, v in r.pass_at.items()) or "no samples", r.mean_reward)
    version, component = results[0].version, topics.component(COMPONENT)
    producer.send(topics.metrics, MetricEvent(component=component, values={**metric_values(results), **(extra or {}),
                                                                           "version": float(version)},
                                              step=version), key=component)
    producer.flush()


def evaluate_checkpoint(cfg: EvalConfig, rollout: RolloutConfig, model: ModelSpec, directory: Path) -> list[EvalResult]:
    """Score an HF directory (or a trainer checkpoint holding `hf/`) once; no broker needed."""
    hf = export_dir(directory)
    if not any(hf.glob("*.safetensors")) and not any(hf.glob("*.bin")):
        raise ValueError(f"--checkpoint {directory}: no weights (*.safetensors) there or in its hf/")
    spec = model.model_copy(update={"init_from": str(hf)})
    evaluator = Evaluator(build_engine(rollout.engine, spec), rollout, cfg, spec.name)
    return evaluator.evaluate(version=_version_of(directory))


def export_dir(directory: Path) -> Path:
    """The HF directory of `directory`: a trainer checkpoint's hf/, else the directory itself."""
    return directory / "hf" if (directory / "hf").is_dir() else directory


def _version_of(directory: Path) -> int:
    """A trainer checkpoint `step-00000120` holds version 120; any other directory counts as 0."""
    name = directory.name
    return int(name.split("-", 1)[1]) if name.startswith("step-") and name[5:].isdigit() else 0
