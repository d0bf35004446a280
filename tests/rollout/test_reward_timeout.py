"""A reward that hangs, through the real rollout worker on the broker: the task goes to the rejected
topic with reason `timeout` after `rollout.reward_timeout_s`, and the worker goes on to the next task;
in an evaluation the answer scores 0 and the evaluation finishes."""

from __future__ import annotations

import threading
import time

import pytest

from undertow.schemas import Experience, Rejected, Task
from undertow.streams import RecordProducer, Topics
from undertow.rollout.worker import RolloutWorker
from tests.helpers import load_run, read_all
from tests.rollout import hanging_rewards


@pytest.fixture(autouse=True)
def release():
    """A fresh event per test (set at its end: the hung threads finish)."""
    hanging_rewards.RELEASE = threading.Event()
    yield
    hanging_rewards.RELEASE.set()


def test_a_hanging_reward_scores_zero_in_an_evaluation_that_finishes():
    from undertow.infra.run.config import RunConfig
    from undertow.rollout.engines import build_engine
    from undertow.rollout.evaluation import Evaluator

    cfg = RunConfig.model_validate({
        "rollout": {"chat_template": False, "sampling": {"max_new_tokens": 2}, "reward_timeout_s": 0.2,
                    "reward": "tests.rollout.hanging_rewards.hang"},
        "eval": {"tasksets": [{"name": "sums", "source": {"name": "sums", "size": 8}}]}})
    evaluator = Evaluator(build_engine(cfg.rollout.engine, cfg.model), cfg.rollout, cfg.eval, "tiny")
    release = threading.Timer(120.0, hanging_rewards.RELEASE.set)  # without the timeout: late, all answers right
    release.daemon = True
    release.start()
    started = time.monotonic()
    try:
        (result,) = evaluator.evaluate(0)
    finally:
        release.cancel()
    # 4 calls wait 0.2 s each (registry.MAX_HUNG), the 4 others are refused at once
    assert time.monotonic() - started < 60  # the hung calls return at the release, 120 s
    assert result.greedy_accuracy == 0.0 and result.mean_reward == 0.0 and result.tasks == 8


@pytest.mark.broker
def test_a_hanging_reward_times_out_to_the_rejected_topic_and_the_worker_goes_on(kafka, namespace, config_path):
    rollout = {"sampling": {"max_new_tokens": 2}, "reward": "tests.rollout.hanging_rewards.hang_on_seven",
               "reward_timeout_s": 0.5}
    config, context = load_run(config_path(rollout=rollout), kafka)
    topics = Topics(namespace)
    with RecordProducer(kafka) as producer:
        producer.send(topics.tasks, Task(task_id="hangs", prompt="3+4=", answer="7", group_size=2), key="hangs")
        producer.send(topics.tasks, Task(task_id="fine", prompt="1+1=", answer="2", group_size=2), key="fine")
    started = time.monotonic()
    release = threading.Timer(120.0, hanging_rewards.RELEASE.set)  # without the timeout: a late answer, not a hung test
    release.daemon = True
    release.start()
    try:
        stats = RolloutWorker(config.rollout, context, "w").run(max_tasks=2)
    finally:
        release.cancel()
    assert time.monotonic() - started < 60  # the hung calls return at the release, 120 s
    assert stats.failed_tasks == 1 and stats.experiences == 2
    (rejected,) = read_all(kafka, topics.rejected, Rejected)
    assert (rejected.stage, rejected.reason, rejected.record_id) == ("rollout", "timeout", "hangs")
    assert "reward 'tests.rollout.hanging_rewards.hang_on_seven': no result within 0.5 s" in rejected.detail
    assert {e.task_id for e in read_all(kafka, topics.raw, Experience)} == {"fine"}
