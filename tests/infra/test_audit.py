"""The books of a run (tests/audit.py) on the real broker: each way an experience or a task can go
astray is counted as such, and poison on the raw topic is counted, not fatal."""

from __future__ import annotations

import json

import pytest

from tests.audit import audit
from undertow.schemas import Experience, Task
from undertow.streams import RecordProducer, Topics

pytestmark = [pytest.mark.broker]


def experience(eid: str, task_id: str) -> Experience:
    return Experience(experience_id=eid, task_id=task_id, group_id=task_id, group_size=1, sample_index=0,
                      prompt_text="1+1=", prompt_tokens=[1], response_text="2", response_tokens=[2],
                      policy_version=0, finish_reason="stop")


def test_the_books_name_what_was_lost_twice_or_missing(kafka, namespace, tmp_path):
    topics = Topics(namespace)
    with RecordProducer(kafka) as p:
        for tid in ("s/0@0", "s/1@1", "s/2@2", "s/3@3", "s/1@1"):  # s/1@1 published twice
            p.send(topics.tasks, Task(task_id=tid, prompt="1+1="), key=tid)
        for eid, tid in [("a", "s/0@0"), ("b", "s/0@0"), ("c", "s/1@1"), ("d", "s/1@1")]:
            p.send(topics.raw, experience(eid, tid), key=tid)
        p.send_bytes(topics.raw, b"poison", key="x")
        p.reject(topics.rejected, stage="clean", reason="empty", record_id="c")
        p.reject(topics.rejected, stage="decode", reason="undecodable")  # the poison, no id
        p.reject(topics.rejected, stage="rollout", reason="workflow_error", record_id="s/2@2")  # a task
    ledger = tmp_path / "ledger.jsonl"
    ledger.write_text(json.dumps({"step": 1, "ids": ["a", "b"]}) + "\n" + json.dumps({"step": 2, "ids": ["a"]}) + "\n")

    books = audit(kafka, namespace, ledger)
    assert books.published == {"a", "b", "c", "d"} and books.raw_not_experiences == 1
    assert books.lost == {"d"} and books.twice == {"a"}
    assert books.tasks_missing == {"s/3@3"} and books.tasks_twice == {"s/1@1"}  # s/2@2 was rejected
    assert books.rejected_by_reason == {"clean/empty": 1, "decode/undecodable": 1, "rollout/workflow_error": 1}
    assert "lost 1, trained twice 1" in books.summary()
