"""undertow's data contracts: the records on every topic, their wire codec and Arrow schema, how older
versions of them are read (versions.py), and the log-prob definition (logprobs.py). The registry,
config loading and model builders are kernel/'s."""

from .arrow import arrow_schema, from_arrow, to_arrow
from .base import MAX_TEXT_CHARS, MAX_TOKENS, SCHEMA_VERSION, Packed, Record, record_type, record_types
from .codec import MAX_RECORD_BYTES, DecodeError, decode, encode
from .evals import EvalResult
from .events import MAX_ORIGINAL_BYTES, MetricEvent, Rejected
from .experience import Experience, PreferencePair
from .task import Task, TaskStat
from .versions import UPGRADERS, UpgradeError, current_version, upgrade, upgrader
from .weights import (
    Bucket,
    TensorMeta,
    WeightIntegrityError,
    WeightUpdate,
    announce_buckets,
    assemble_weights,
    chunk_weights,
    manifest_digest,
    verify_manifest,
    verify_weights,
)

__all__ = [
    "MAX_ORIGINAL_BYTES",
    "MAX_RECORD_BYTES",
    "MAX_TEXT_CHARS",
    "MAX_TOKENS",
    "SCHEMA_VERSION",
    "Bucket",
    "DecodeError",
    "EvalResult",
    "Experience",
    "MetricEvent",
    "Packed",
    "PreferencePair",
    "Record",
    "Rejected",
    "Task",
    "TaskStat",
    "UPGRADERS",
    "UpgradeError",
    "TensorMeta",
    "WeightIntegrityError",
    "WeightUpdate",
    "announce_buckets",
    "arrow_schema",
    "assemble_weights",
    "chunk_weights",
    "current_version",
    "decode",
    "encode",
    "from_arrow",
    "manifest_digest",
    "record_type",
    "record_types",
    "to_arrow",
    "upgrade",
    "upgrader",
    "verify_weights",
    "verify_manifest",
]
