"""Agents through the real broker: a worker runs the tool-using workflow (the tiny model that replays a
tool conversation, a tool that hangs, an unknown tool) and then the frozen_lake game; the experiences
on the raw topic carry the engine's tokens, masks on them alone, and the tool outcomes in metrics."""

from __future__ import annotations

import pytest

from undertow.schemas import Experience, MetricEvent, Task
from undertow.streams import RecordProducer, Topics
from undertow.rollout.worker import RolloutWorker
from tests.helpers import load_run, read_all
from tests.rollout.scripted_model import ANSWER, QUESTION, RESPONSES, TIMEOUT_S, TOOLS

pytestmark = [pytest.mark.broker]


def test_tool_agent_and_frozen_lake_through_the_broker(kafka, namespace, config_path, scripted_weights):
    topics = Topics(namespace)
    model = {"source": "tiny", "tiny": {"n_positions": 640}, "init_from": str(scripted_weights)}
    tool_rollout = {"sampling": {"max_new_tokens": 60, "greedy": True}, "reward": "numeric_match", "batch_tasks": 4,
                    "workflow": {"name": "tool_agent", "tools": TOOLS, "parser": "pythonic", "timeout_s": TIMEOUT_S}}
    config, context = load_run(config_path(model=model, rollout=tool_rollout), kafka)
    worker = RolloutWorker(config.rollout, context, "agent")
    with RecordProducer(kafka) as producer:
        for i in range(2):
            producer.send(topics.tasks, Task(task_id=f"calc{i}", prompt=QUESTION, answer=ANSWER, group_size=2),
                          key=f"calc{i}")
    assert worker.run(max_tasks=2, idle_timeout=30).tasks == 2
    tok = worker.engine.tokenizer
    exps = read_all(kafka, topics.raw, Experience)
    assert sorted(e.experience_id for e in exps) == ["calc0/0", "calc0/1", "calc1/0", "calc1/1"]
    for e in exps:
        assert e.reward == 1.0 and e.metadata["tools"] == {"ok": 1, "timeout": 1, "unknown_tool": 1}
        assert len(e.loss_mask) == len(e.response_tokens) == len(e.behaviour_logprobs)
        policy = [t for t, m in zip(e.response_tokens, e.loss_mask) if m == 1]
        assert policy == tok("<eos>".join(RESPONSES) + "<eos>", add_special_tokens=False)["input_ids"]
    metrics = [m for m in read_all(kafka, topics.metrics, MetricEvent) if m.component == "agent"]
    counted = {k: sum(m.values.get(k, 0.0) for m in metrics) for k in ("tool_ok", "tool_timeout", "tool_unknown_tool")}
    assert counted == {"tool_ok": 4.0, "tool_timeout": 4.0, "tool_unknown_tool": 4.0}

    # The grid game, on the same broker: a multi-turn reward, observations masked out.
    lake_rollout = {"sampling": {"max_new_tokens": 8}, "reward": "format", "workflow": {
        "name": "multi_turn", "max_turns": 3, "environment": {"name": "frozen_lake", "size": 3}}}
    config, context = load_run(config_path(rollout=lake_rollout), kafka)
    with RecordProducer(kafka) as producer:
        producer.send(topics.tasks, Task(task_id="lake", prompt="Walk to G.", group_size=3), key="lake")
    assert RolloutWorker(config.rollout, context, "lake").run(max_tasks=1, idle_timeout=30).tasks == 1
    lake = [e for e in read_all(kafka, topics.raw, Experience) if e.task_id == "lake"]
    assert len(lake) == 3
    for e in lake:
        assert "env" in e.reward_components and e.loss_mask[0] == 1 and len(e.loss_mask) == len(e.response_tokens)
        turns = e.metadata["turns"]
        observed = worker.engine.tokenizer.decode([t for t, m in zip(e.response_tokens, e.loss_mask) if m == 0])
        assert observed.count("\nassistant: ") == turns - 1  # no observation after the last response
