"""Metric events (everyone -> monitor) and rejected records (any stage -> inspection)."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import Field

from .base import Finite, Id, Record, UnixTime

MAX_ORIGINAL_BYTES = 1 << 20  # keeps a Rejected well under the record size limit
MAX_DETAIL_CHARS = 16 << 10


class MetricEvent(Record):
    """Named values from one component at one step (throughput, rewards, losses, lag, ...)."""

    kind: ClassVar[str] = "metric"
    id_field: ClassVar[str | None] = None

    component: Id
    values: dict[str, Finite]
    step: int | None = None
    time: UnixTime
    labels: dict[str, str] = {}


class Rejected(Record):
    """A record some stage dropped, with why; nothing is lost silently.

    `reason` is short and machine-readable ("undecodable", "schema_version", "invalid", "stale",
    "duplicate", "truncated", ...); `detail` says which field and why, for people.
    """

    kind: ClassVar[str] = "rejected"
    id_field: ClassVar[str | None] = "record_id"

    stage: Id
    reason: Id
    detail: Annotated[str, Field(max_length=MAX_DETAIL_CHARS)] = ""
    original: Annotated[bytes, Field(max_length=MAX_ORIGINAL_BYTES)]
    original_key: Annotated[bytes, Field(max_length=MAX_ORIGINAL_BYTES)] | None = None
    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    record_id: str | None = None  # experience / task id when known
    time: UnixTime

    @classmethod
    def of(cls, stage: str, reason: str, original: bytes, *, detail: str = "", **where: object) -> Rejected:
        """A Rejected that always validates: cuts `original` and `detail` to their bounds.

        `where` takes the optional fields (original_key, topic, partition, offset, record_id).
        """
        if len(original) > MAX_ORIGINAL_BYTES:
            detail = f"[original cut from {len(original)} bytes] {detail}".rstrip()
            original = original[:MAX_ORIGINAL_BYTES]
        key = where.get("original_key")
        if isinstance(key, bytes) and len(key) > MAX_ORIGINAL_BYTES:
            where["original_key"] = key[:MAX_ORIGINAL_BYTES]
        return cls(stage=stage, reason=reason, original=original, detail=detail[:MAX_DETAIL_CHARS], **where)
