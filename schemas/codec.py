"""Record <-> bytes. Every decode validates; a failure is a DecodeError with a reason.

Wire format: a msgpack map {"kind": <kind>, <field>: <value>, ...} with every field of the record.
Fields whose type carries a `Packed` marker (token ids, masks, log-probs, advantages) travel as
one msgpack bin of little-endian values of that dtype instead of a msgpack array: 4 bytes per
token id or float, 1 per mask entry. Float arrays are float32 on purpose: it halves their size,
and fp32 is the precision inference engines report log-probs in anyway. A value round-trips
exactly when it is fp32-representable, else it comes back as the nearest fp32. Scalar floats
(rewards, timestamps, priorities) stay float64.
"""

from __future__ import annotations

from functools import cache

import msgpack
import numpy as np
from pydantic import BaseModel, ValidationError

from .base import MAX_TOKENS, Packed, Record, record_type, record_types
from .versions import UpgradeError, check_version, current_version, upgrade

MAX_RECORD_BYTES = 16 << 20
_MAX_MAP_LEN = 1 << 16  # metadata maps; no record has more fields than this
_MAX_DETAIL_ERRORS = 10  # a record with a million bad tokens still gets a short detail


class DecodeError(ValueError):
    """Bytes that are not a valid record.

    `reason` is one of "too_large", "undecodable", "unknown_kind", "schema_too_new" (written by a newer
    schema than this reader's), "schema_version" (no version this reader knows: not an int from 1, or no
    upgrader from it; versions.py), "invalid", "unexpected_kind"; `detail` names the field and why. `kind` and `record_id` are filled in
    when they could be read, so the caller can key its Rejected record.
    """

    def __init__(self, reason: str, detail: str, *, kind: str | None = None, record_id: str | None = None):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.kind = kind
        self.record_id = record_id


@cache  # classes are immutable once created, so this never goes stale
def _packed_fields(cls: type[Record]) -> dict[str, tuple[np.dtype, int]]:
    """field name -> (dtype, max items) for every Packed field of `cls`."""
    out = {}
    for name, info in cls.model_fields.items():
        dtypes = [m.dtype for m in info.metadata if isinstance(m, Packed)]
        if dtypes:
            limits = [m.max_length for m in info.metadata if isinstance(getattr(m, "max_length", None), int)]
            out[name] = (np.dtype(dtypes[0]), min(limits, default=MAX_TOKENS))
    return out


def encode(record: Record) -> bytes:
    """The wire bytes of `record`. It is not revalidated: records are checked when built and decoded."""
    cls = type(record)
    kind = getattr(cls, "kind", None)
    if record_type(kind) is not cls:
        raise TypeError(f"{cls.__name__} has no registered kind; only registered records go on the wire")
    packed = _packed_fields(cls)
    payload: dict[str, object] = {"kind": kind}
    for name in cls.model_fields:
        value = getattr(record, name)
        payload[name] = np.asarray(value, dtype=packed[name][0]).tobytes() if name in packed else _plain(value)
    return msgpack.packb(payload, use_bin_type=True)


def _plain(value: object) -> object:
    """Nested models (a weights manifest's buckets) as the maps and lists msgpack knows."""
    if isinstance(value, BaseModel):
        return value.model_dump()
    if isinstance(value, (tuple, list)) and value and isinstance(value[0], BaseModel):
        return [v.model_dump() for v in value]  # type: ignore[union-attr]
    return value


def decode(
    data: bytes,
    expect: type[Record] | tuple[type[Record], ...] | None = None,
    *,
    max_bytes: int = MAX_RECORD_BYTES,
) -> Record:
    """Parse and validate one record; raise DecodeError saying why when that fails.

    Checks run cheapest first: size, msgpack, envelope (a map with a str kind), known kind,
    schema_version, field validation, and last whether the kind is one of `expect`. A record of an
    older version of its kind is upgraded (schemas/versions.py) before it is validated.
    """
    if len(data) > max_bytes:
        raise DecodeError("too_large", f"{len(data)} bytes > max_bytes {max_bytes}")
    obj = _unpack(data, max_bytes)
    if not isinstance(obj, dict):
        raise DecodeError("undecodable", f"expected a msgpack map, got {type(obj).__name__}")
    kind = obj.pop("kind", None)
    if not isinstance(kind, str):
        raise DecodeError("undecodable", f"kind: expected a string, got {type(kind).__name__}")
    cls = record_type(kind)
    if cls is None:
        raise DecodeError("unknown_kind", f"kind: {kind[:64]!r} is not one of {sorted(record_types())}")
    record_id = obj.get(cls.id_field) if cls.id_field else None
    record_id = record_id[:256] if isinstance(record_id, str) and record_id else None
    current = current_version(cls)
    try:
        version = check_version(kind, obj.get("schema_version"), current)
        for name, (dtype, limit) in _packed_fields(cls).items():
            if name in obj:
                obj[name] = _unpack_array(name, obj[name], dtype, limit)
        if version < current:
            obj = upgrade(kind, obj, current)
        record = cls.model_validate(obj)
    except UpgradeError as e:
        raise DecodeError(e.reason, e.detail, kind=kind, record_id=record_id) from None
    except ValueError as e:  # ValidationError is a ValueError too
        detail = _describe(e) if isinstance(e, ValidationError) else str(e)
        raise DecodeError("invalid", detail, kind=kind, record_id=record_id) from None
    if expect is not None and not isinstance(record, expect):
        wanted = [c.kind for c in (expect if isinstance(expect, tuple) else (expect,))]
        detail = f"kind: got {kind!r}, expected one of {wanted}"
        raise DecodeError("unexpected_kind", detail, kind=kind, record_id=record_id)
    return record


def _unpack(data: bytes, max_bytes: int) -> object:
    try:
        return msgpack.unpackb(
            data,
            raw=False,  # strings must be valid UTF-8
            strict_map_key=True,  # map keys must be str or bytes
            max_str_len=max_bytes,
            max_bin_len=max_bytes,
            max_array_len=MAX_TOKENS,
            max_map_len=_MAX_MAP_LEN,
            max_ext_len=0,  # no ext types (timestamps or otherwise) in our records
        )
    except (ValueError, TypeError, msgpack.UnpackException) as e:
        raise DecodeError("undecodable", f"not msgpack: {e}") from None


def _unpack_array(name: str, value: object, dtype: np.dtype, limit: int) -> list:
    if not isinstance(value, bytes):
        raise ValueError(f"{name}: expected packed {dtype.str} bytes, got {type(value).__name__}")
    if len(value) % dtype.itemsize:
        raise ValueError(f"{name}: {len(value)} bytes is not a multiple of {dtype.itemsize} ({dtype.str})")
    count = len(value) // dtype.itemsize
    if count > limit:  # refuse before building a huge list
        raise ValueError(f"{name}: {count} items > max {limit}")
    return np.frombuffer(value, dtype=dtype).tolist()


def _describe(error: ValidationError) -> str:
    """'loc.path: why' for each error, joined by '; ' (the first few of many)."""
    parts = []
    for item in error.errors(include_url=False, include_input=False):
        loc = ".".join(str(p) for p in item["loc"])
        cause = item.get("ctx", {}).get("error")
        # Our own validators raise ValueError; show their message without pydantic's prefix.
        message = str(cause) if item["type"] == "value_error" and cause is not None else item["msg"]
        parts.append(f"{loc}: {message}" if loc else message)
    more = len(parts) - _MAX_DETAIL_ERRORS
    return "; ".join(parts[:_MAX_DETAIL_ERRORS]) + (f"; ... and {more} more" if more > 0 else "")
