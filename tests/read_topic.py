"""Reading a whole topic back in tests: every record from the beginning to the end offsets of now."""

from __future__ import annotations

from schemas import Record, decode
from streams import KafkaSettings
from streams.consumer import read_to_end


def read_all(kafka: KafkaSettings, topic: str, expect: type[Record] | tuple | None = None) -> list:
    """Every record on `topic` now (decoded and validated as `expect`), in partition order."""
    return [decode(value, expect=expect) for value in read_to_end(kafka, topic)]
