"""A reward model and an LLM judge scoring in a real processor worker (`undertow process`) on the real
broker, with one judge answer taking seconds: the worker's event loop goes on meanwhile."""

from __future__ import annotations

import pytest

from undertow.kernel.scoring import Item, LLMJudge, RewardModelScorer
from undertow.schemas import Experience, MetricEvent, Rejected
from undertow.streams import RecordProducer, Topics
from tests.helpers import exp
from tests.processors.test_broker import read, start, stop
from tests.scoring_models import JudgeServer, reward_model_dir

pytestmark = [pytest.mark.broker]


def test_a_reward_model_and_a_judge_score_through_the_broker_without_stalling_the_worker(kafka, namespace, tmp_path):
    rm = reward_model_dir(tmp_path / "rm")
    texts = [f"{i} * 6 = {42 if i % 2 else 40}" for i in range(10)] + ["slow: 42", "garbage"]
    samples = [exp(f"g{i}", 0, 1, None, text=t) for i, t in enumerate(texts)]
    topics = Topics(namespace)
    with JudgeServer(slow_s=4.0) as server:
        judge = {"name": "llm_judge", "base_url": server.base_url, "model": "judge", "verdict": "regex",
                 "batch_size": 1, "workers": 4, "timeout_s": 20}
        pipeline = [{"name": "score", "scorer": {"name": "reward_model", "path": str(rm)}},
                    {"name": "score", "scorer": judge}]
        proc = start(tmp_path, namespace, pipeline=pipeline, metrics_every_s=0.5)
        try:
            with RecordProducer(kafka) as p:
                for e in samples:
                    p.send(topics.raw, e, key=e.group_id)
            ready = read(kafka, topics.ready, Experience, len(samples) - 1, proc=proc)
            rejected = read(kafka, topics.rejected, Rejected, 1)
            metrics = read(kafka, topics.metrics, MetricEvent, 1, timeout=10)
            assert proc.poll() is None, (tmp_path / "process-1.log").read_text()[-3000:]
        finally:
            stop(proc)
    assert [(r.stage, r.reason, r.record_id) for r in rejected] == [("score", "scorer_unparsable", "g11/0")]
    assert sorted(e.response_text for e in ready) == sorted(texts[:-1])
    rm_scores = RewardModelScorer(path=rm).score
    judged_by = LLMJudge(base_url=server.base_url, model="judge", verdict="regex").scored_by
    by = [RewardModelScorer(path=rm).scored_by, judged_by]
    for e in ready:
        # The judge server says "Score: 7" for a "42" in the prompt, else "Score: 2" (scale 0..10).
        assert e.reward_components["llm_judge"] == pytest.approx(0.7 if "42" in e.response_text else 0.2)
        assert e.reward_components["reward_model"] == pytest.approx(rm_scores([Item("p", e.response_text)])[0].value,
                                                                    abs=1e-5)
        assert e.reward == pytest.approx(sum(e.reward_components.values()))
        assert e.metadata["scored_by"] == by
    # While the slow answer was awaited (4 s), the worker kept reporting metrics (every 0.5 s): its
    # event loop was free. With the batch on the loop, nothing would be sent until the answer came.
    (slow_start, slow_end), = server.slow_windows
    during = [m for m in metrics if m.component == "processors" and slow_start + 0.5 < m.time < slow_end - 0.5]
    assert len(during) >= 2, [m.time for m in metrics]
