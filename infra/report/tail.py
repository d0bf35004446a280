"""`undertow tail`: the records of any undertow topic as people read them, undecodable bytes included.

Each message becomes a flat view: the record's kind and its fields, with texts kept, per-token
arrays summarised (an experience's advantage is the mean over its tokens) and bytes counted; a
rejected record also says what its original bytes decode to. A message that does not decode is a
view of kind "undecodable" with the reason and the first bytes in hex, never an exception.
"""

from __future__ import annotations

import operator
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from undertow.schemas import DecodeError, Experience, Record, Rejected, decode
from undertow.streams import KafkaSettings, RecordConsumer
from undertow.streams.consumer import Message
from undertow.streams.topics import CATALOG

HEAD_BYTES = 32  # of an undecodable message, shown in hex
LONG_LIST = 8  # longer lists are shown as their length


def topic_name(topic: str, namespace: str) -> str:
    """`experiences.ready` in a namespace, or a full topic name as given."""
    return f"{namespace}.{topic}" if topic in {spec.suffix for spec in CATALOG} else topic


def view(message: Message) -> dict[str, Any]:
    """What one message holds, flat and readable; where it was on the topic first."""
    where = {"partition": message.partition, "offset": message.offset,
             "key": message.key.decode("utf-8", "replace") if message.key is not None else None}
    try:
        record = decode(message.value)
    except DecodeError as e:
        return {**where, "kind": "undecodable", "reason": e.reason, "detail": e.detail,
                "bytes": len(message.value), "head": message.value[:HEAD_BYTES].hex()}
    return {**where, **record_view(record)}


def record_view(record: Record) -> dict[str, Any]:
    fields = {k: _short(v) for k, v in record.model_dump().items() if k != "schema_version"}
    out: dict[str, Any] = {"kind": record.kind}
    if isinstance(record, Experience):
        advantages = record.advantages
        out |= {"experience_id": record.experience_id, "policy_version": record.policy_version,
                "reward": record.reward, "advantage": sum(advantages) / len(advantages) if advantages else None,
                "finish_reason": record.finish_reason, "prompt_text": record.prompt_text,
                "response_text": record.response_text}
    if isinstance(record, Rejected):
        out |= {"stage": record.stage, "reason": record.reason, "detail": record.detail,
                "record_id": record.record_id, "original_kind": _kind_of(record.original)}
    return out | {k: v for k, v in fields.items() if k not in out}


def _kind_of(data: bytes) -> str:
    try:
        return decode(data).kind
    except DecodeError as e:
        return f"undecodable ({e.reason})"


def _short(value: Any) -> Any:
    if isinstance(value, bytes):
        return f"<{len(value)} bytes>"
    if isinstance(value, list) and len(value) > LONG_LIST:
        return f"<{len(value)} items>"
    return value


OPERATORS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge, "<=": operator.le, "!=": operator.ne, "=": operator.eq, ">": operator.gt, "<": operator.lt}
_CONDITION = re.compile(r"^\s*(\w+)\s*(>=|<=|!=|=|>|<)\s*(.*?)\s*$")


@dataclass(frozen=True)
class Condition:
    """`field OP value` on a view: numbers compare as numbers, anything else as text."""

    field: str
    op: str
    value: str

    @classmethod
    def parse(cls, text: str) -> "Condition":
        match = _CONDITION.match(text)
        if not match:
            raise ValueError(f"--where {text!r}: expected FIELD OP VALUE with OP one of {', '.join(OPERATORS)}")
        return cls(*match.groups())

    def holds(self, row: dict[str, Any]) -> bool:
        if self.field not in row or row[self.field] is None:
            return self.op == "!="
        have, want = row[self.field], self.value
        if isinstance(have, (int, float)) and not isinstance(have, bool):
            try:
                return OPERATORS[self.op](float(have), float(want))
            except ValueError:
                return False
        return OPERATORS[self.op](str(have), want)


def tail(kafka: KafkaSettings, topic: str, *, last: int | None, follow: bool,
         stop: Callable[[], bool] = lambda: False) -> Iterator[dict[str, Any]]:
    """Views of `topic`: the `last` messages of each partition (None: from the beginning), then, with
    `follow`, each new one until `stop()`; else up to the end offsets of when it started."""
    with RecordConsumer(kafka, [], group_id=None, expect=Record, rejected_topic="", stage="tail") as consumer:
        first = consumer.assign(topic, "earliest")
        ends = consumer.end_offsets()
        if last is not None:
            consumer.assign(topic, {p: max(first[p], ends[p] - last) for p in first})
        while not stop() and (follow or not consumer.reached(ends)):
            for message in consumer.poll_messages(timeout_ms=500):
                if follow or message.offset < ends[(message.topic, message.partition)]:
                    yield view(message)
