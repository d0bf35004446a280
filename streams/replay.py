"""`undertow replay`: select historic experiences and send them to a topic again, for offline training.

A Selection is SQL over the history views (offset range, time range, free filter), always ordered by
namespace, topic, partition and offset, so the same selection sends the same records in the same
order. A shape (registry `replay_shapes`, config `name` or `{name: …, **kwargs}`) turns the selected
experiences into what the target needs:

- `as_is`: unchanged, behaviour log-probs and advantages kept (off-policy RL with importance correction);
- `sft_best`: the best-rewarded sample of each prompt group, as a group of one (SFT);
- `dpo_pairs`: best vs worst response of each prompt group as a PreferencePair (DPO);
- `unprocessed`: advantages and the processors' marks cleared, for the raw topic (re-processing).
"""

from __future__ import annotations

import datetime as dt
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable

from undertow.kernel.progress import Bar
from undertow.kernel.registry import Registry
from undertow.schemas import Experience, PreferencePair, Record, from_arrow, record_type
from undertow.streams.history import VIEWS, History
from undertow.streams.producer import RecordProducer

Shape = Callable[..., list[Record]]
replay_shapes: Registry[Shape] = Registry("replay shape")
ORDER = "namespace, kafka_topic, kafka_partition, kafka_offset"


@dataclass(frozen=True)
class Selection:
    """Which archived records to replay: a view, then any of partition/offset range, time range, SQL filter."""

    view: str = "experiences"
    partition: int | None = None
    first_offset: int | None = None  # inclusive
    last_offset: int | None = None  # inclusive
    since: dt.datetime | None = None  # Kafka timestamp, inclusive
    until: dt.datetime | None = None  # Kafka timestamp, exclusive
    where: str | None = None  # any SQL condition over the view's columns
    namespace: str | None = None  # only rows archived from this namespace

    def sql(self) -> str:
        if self.view not in VIEWS:
            raise ValueError(f"replay: view {self.view!r} unknown; expected one of {sorted(VIEWS)}")
        conditions = []
        if self.namespace is not None:
            conditions.append(f"namespace = '{_quoted(self.namespace)}'")
        if self.partition is not None:
            conditions.append(f"kafka_partition = {int(self.partition)}")
        if self.first_offset is not None:
            conditions.append(f"kafka_offset >= {int(self.first_offset)}")
        if self.last_offset is not None:
            conditions.append(f"kafka_offset <= {int(self.last_offset)}")
        if self.since is not None:
            conditions.append(f"kafka_timestamp >= to_timestamp({_epoch(self.since)})")
        if self.until is not None:
            conditions.append(f"kafka_timestamp < to_timestamp({_epoch(self.until)})")
        if self.where:
            conditions.append(f"({self.where})")
        where = f" WHERE {' AND '.join(conditions)}" if conditions else ""
        return f"SELECT * FROM {self.view}{where} ORDER BY {ORDER}"


def _quoted(text: str) -> str:
    return text.replace("'", "''")


def _epoch(moment: dt.datetime) -> float:
    return (moment if moment.tzinfo else moment.replace(tzinfo=dt.timezone.utc)).timestamp()


@dataclass(frozen=True)
class ReplayResult:
    """What a replay did."""

    selected: int
    sent: int
    topic: str
    seconds: float

    @property
    def records_per_s(self) -> float:
        return self.sent / self.seconds if self.seconds else 0.0


def select(history: History, selection: Selection) -> list[Record]:
    """The selected records, validated again, in replay order."""
    table = history.query(selection.sql())
    return from_arrow(table, record_type(VIEWS[selection.view].kind))


def replay(history: History, selection: Selection, shape: str | dict[str, Any], producer: RecordProducer,
           topic: str, bar: Bar | None = None) -> ReplayResult:
    """Select, shape and send to `topic`; returns once every record is acknowledged (`bar` counts them)."""
    started = time.monotonic()
    bar = bar or Bar()
    component = replay_shapes.resolve(shape)
    records = select(history, selection)
    out = component(records)
    bar.total(len(out))
    send_acknowledged(producer, [(topic, r) for r in out], bar)
    return ReplayResult(len(records), len(out), topic, time.monotonic() - started)


def send_acknowledged(producer: RecordProducer, routed: list[tuple[str, Record]], bar: Bar | None = None) -> None:
    """Send each (topic, record) under the live topics' key; returns once the broker acknowledged every
    one (raises if it refused one: a count printed afterwards is what arrived)."""
    futures = [producer.send(topic, r, key=replay_key(r)) for topic, r in routed]
    producer.flush()
    for f in futures:
        f.get(timeout=60)
        if bar is not None:
            bar.advance()


def replay_key(record: Record) -> str:
    """The key the live topics use: group id for experiences (a group shares a partition), else task id."""
    return record.group_id if isinstance(record, Experience) else record.task_id


def _groups(records: list[Experience]) -> dict[str, list[Experience]]:
    groups: dict[str, list[Experience]] = defaultdict(list)
    for r in records:
        groups[r.group_id].append(r)
    return groups


def _scored(records: list[Experience]) -> list[Experience]:
    missing = [r.experience_id for r in records if r.reward is None]
    if missing:
        raise ValueError(f"replay: {len(missing)} selected experience(s) have no reward (e.g. {missing[0]}); "
                         "select scored ones, e.g. --where 'reward IS NOT NULL'")
    return records


def _best(group: list[Experience]) -> Experience:
    return min(group, key=lambda r: (-r.reward, r.sample_index))  # ties: the lowest sample index


def _worst(group: list[Experience]) -> Experience:
    return min(group, key=lambda r: (r.reward, r.sample_index))


@replay_shapes.register("as_is")
def as_is(records: list[Experience]) -> list[Record]:
    """Unchanged: the trainer corrects for the old policy with the stored behaviour log-probs."""
    return list(records)


@replay_shapes.register("sft_best")
def sft_best(records: list[Experience], *, min_reward: float | None = None) -> list[Record]:
    """The best sample of each group (reward >= min_reward), each its own group of one for SFT."""
    out = []
    for group_id, group in _groups(_scored(records)).items():
        best = _best(group)
        if min_reward is None or best.reward >= min_reward:
            out.append(best.model_copy(update={
                "group_id": best.experience_id, "group_size": 1, "sample_index": 0,
                "metadata": {**best.metadata, "replayed_from_group": group_id}}))
    return out


@replay_shapes.register("dpo_pairs")
def dpo_pairs(records: list[Experience], *, min_margin: float = 0.0) -> list[Record]:
    """Best vs worst response of each group whose rewards differ by more than `min_margin`."""
    out = []
    for group_id, group in _groups(_scored(records)).items():
        chosen, rejected = _best(group), _worst(group)
        if chosen.reward - rejected.reward <= min_margin:
            continue
        out.append(PreferencePair(
            pair_id=f"{group_id}/{chosen.sample_index}>{rejected.sample_index}", task_id=chosen.task_id,
            prompt_text=chosen.prompt_text, prompt_tokens=chosen.prompt_tokens,
            chosen_text=chosen.response_text, chosen_tokens=chosen.response_tokens,
            rejected_text=rejected.response_text, rejected_tokens=rejected.response_tokens,
            policy_version=max(chosen.policy_version, rejected.policy_version),
            metadata={"chosen_reward": chosen.reward, "rejected_reward": rejected.reward, "group_id": group_id}))
    return out


@replay_shapes.register("unprocessed")
def unprocessed(records: list[Experience]) -> list[Record]:
    """As rollout wrote them: advantages, priority and the processors' timestamp cleared."""
    return [r.model_copy(update={"advantages": [], "priority": 1.0,
                                 "timestamps": {k: v for k, v in r.timestamps.items() if k != "processed"}})
            for r in records]
