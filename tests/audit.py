"""A run's books, checked after the fact: every experience published was trained exactly once or
rejected with a reason, and every task the feeder published reached the raw topic.

Read from the topics themselves and the trainer's ledger (checkpoints/<ns>/ledger.jsonl), so it
holds whatever crashed meanwhile. Shared by the fault tests (tests/faults/) and the chaos soak
(benchmarks/chaos_soak.py).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from undertow.schemas import DecodeError, Experience, Record, Rejected, Task, decode
from undertow.streams import KafkaSettings, Topics
from undertow.streams.consumer import read_to_end


@dataclass
class Books:
    """What a namespace's topics and its trainer's ledger say happened to each experience and task."""

    published: set[str] = field(default_factory=set)  # experience ids on experiences.raw
    trained: Counter[str] = field(default_factory=Counter)  # experience id -> steps that trained on it first
    reused: Counter[str] = field(default_factory=Counter)  # experience id -> steps that replayed it on purpose
    rejected: dict[str, str] = field(default_factory=dict)  # record id -> "stage/reason"
    rejected_by_reason: Counter[str] = field(default_factory=Counter)  # every rejected record, id or not
    raw_not_experiences: int = 0  # records on the raw topic that do not decode as experiences (poison)
    tasks_published: Counter[str] = field(default_factory=Counter)  # task id -> times on the tasks topic
    raw_task_ids: set[str] = field(default_factory=set)  # tasks some experience on the raw topic came from

    @property
    def lost(self) -> set[str]:
        """Published, yet neither trained nor rejected."""
        return self.published - set(self.trained) - set(self.rejected)

    @property
    def twice(self) -> set[str]:
        """Trained for the first time more than once (a deliberate reuse is booked apart, in `reused`)."""
        return {rid for rid, n in self.trained.items() if n > 1}

    @property
    def reused_untrained(self) -> set[str]:
        """Reused, yet never trained first: a replay can only take what a step trained."""
        return set(self.reused) - set(self.trained)

    @property
    def tasks_missing(self) -> set[str]:
        """Tasks published that no experience came from and no stage rejected."""
        return set(self.tasks_published) - self.raw_task_ids - set(self.rejected)

    @property
    def tasks_twice(self) -> set[str]:
        return {tid for tid, n in self.tasks_published.items() if n > 1}

    def summary(self) -> str:
        reasons = ", ".join(f"{r} {n}" for r, n in self.rejected_by_reason.most_common())
        return (f"published {len(self.published)}, trained {len(self.trained)}, rejected "
                f"{sum(self.rejected_by_reason.values())} ({reasons or 'none'}), lost {len(self.lost)}, "
                f"trained twice {len(self.twice)}, reused {sum(self.reused.values())} times "
                f"({len(self.reused)} records, {len(self.reused_untrained)} never trained); "
                f"tasks published {len(self.tasks_published)}, "
                f"missing from raw {len(self.tasks_missing)}, published twice {len(self.tasks_twice)}; "
                f"non-experiences on raw {self.raw_not_experiences}")


def audit(kafka: KafkaSettings, namespace: str, ledger: Path) -> Books:
    """The books of one namespace (one stage of a run) and its trainer's ledger."""
    topics, books = Topics(namespace), Books()
    for record in read_records(kafka, topics.raw):
        if isinstance(record, Experience):
            books.published.add(record.experience_id)
            books.raw_task_ids.add(record.task_id)
        else:
            books.raw_not_experiences += 1
    for record in read_records(kafka, topics.rejected):
        if isinstance(record, Rejected):
            books.rejected_by_reason[f"{record.stage}/{record.reason}"] += 1
            if record.record_id:
                books.rejected[record.record_id] = f"{record.stage}/{record.reason}"
    books.tasks_published.update(r.task_id for r in read_records(kafka, topics.tasks) if isinstance(r, Task))
    if ledger.exists():
        for line in ledger.read_text().splitlines():
            if line.strip():
                entry = json.loads(line)
                books.trained.update(entry["ids"])
                books.reused.update(entry.get("reused", []))
    return books


def read_records(kafka: KafkaSettings, topic: str) -> Iterator[Record | None]:
    """Every record on `topic` now, decoded; None for one that does not decode (poison on the raw
    topic must not stop the count)."""
    for value in read_to_end(kafka, topic):
        try:
            yield decode(value or b"")
        except DecodeError:
            yield None
