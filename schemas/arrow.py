"""Arrow tables of records, for the Parquet archive and DuckDB replay.

The Arrow schema is derived from the pydantic annotations, so a new field reaches the archive
with no edit here; a type this mapping does not know raises TypeError instead of being dropped.
Free-form fields (JSON metadata, chat messages) are stored as JSON text. Rows of an older
`schema_version` are upgraded as the wire's are (schemas/versions.py), newer ones refused.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import pyarrow as pa
from pydantic import BaseModel, JsonValue

from .base import Record
from .versions import current_version, upgrade

_SCALARS = {str: pa.string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_(), bytes: pa.binary()}
# Same widths as on the wire (codec.py): int32 token ids, float32 log-probs / advantages.
_LIST_ITEMS = {int: pa.int32(), float: pa.float32()}
_MAP_VALUES = {float: pa.float64(), str: pa.string()}


@dataclass(frozen=True)
class _Column:
    type: pa.DataType
    nullable: bool = False
    encoding: Literal["plain", "json", "map"] = "plain"  # how Python values become Arrow values


def _strip(tp: Any) -> Any:
    """`X` from `Annotated[X, ...]` (constraints do not change the storage type)."""
    while get_origin(tp) is Annotated:
        tp = get_args(tp)[0]
    return tp


def _column(tp: Any) -> _Column | None:
    """How a field of type `tp` is stored, or None when the mapping does not know `tp`."""
    tp = _strip(tp)
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, UnionType) and NoneType in args:
        rest = [a for a in args if a is not NoneType]
        inner = _column(rest[0]) if len(rest) == 1 else None
        return replace(inner, nullable=True) if inner else None
    if origin is Literal:
        return _Column(pa.string()) if all(isinstance(a, str) for a in args) else None
    if origin is None:
        return _Column(_SCALARS[tp]) if tp in _SCALARS else None
    if origin is list and len(args) == 1:
        item = _strip(args[0])
        if item in _LIST_ITEMS:
            return _Column(pa.list_(_LIST_ITEMS[item]))
        if item is dict or get_origin(item) is dict:
            return _Column(pa.string(), encoding="json")
    if origin is tuple and args and isinstance(_strip(args[0]), type) and issubclass(_strip(args[0]), BaseModel):
        return _Column(pa.string(), encoding="json")  # nested records (a weights manifest)
    if origin is dict and len(args) == 2 and _strip(args[0]) is str:
        value = _strip(args[1])
        if value is JsonValue:
            return _Column(pa.string(), encoding="json")
        if value in _MAP_VALUES:
            return _Column(pa.map_(pa.string(), _MAP_VALUES[value]), encoding="map")
    return None


def _to_json(value: Any) -> str:
    if isinstance(value, tuple) and value and isinstance(value[0], BaseModel):
        value = [v.model_dump() for v in value]
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _columns(cls: type[Record]) -> dict[str, _Column]:
    out = {}
    for name, info in cls.model_fields.items():
        column = _column(info.annotation)
        if column is None:
            raise TypeError(
                f"{cls.__name__}.{name}: no Arrow type for {info.annotation!r}; add one in schemas/arrow.py"
            )
        out[name] = column
    return out


def arrow_schema(cls: type[Record]) -> pa.Schema:
    """The Arrow schema of a table of `cls` records (one column per field)."""
    fields = [pa.field(name, c.type, nullable=c.nullable) for name, c in _columns(cls).items()]
    metadata = {"undertow.schema_version": str(current_version(cls))}
    if isinstance(getattr(cls, "kind", None), str):
        metadata["undertow.kind"] = cls.kind
    return pa.schema(fields, metadata=metadata)


def to_arrow(records: Sequence[Record], cls: type[Record] | None = None) -> pa.Table:
    """One table of records of one class (`cls` names it when `records` is empty)."""
    classes = {type(r) for r in records} | ({cls} if cls else set())
    if len(classes) != 1:
        names = sorted(c.__name__ for c in classes)
        raise ValueError(f"to_arrow needs records of exactly one class, got {names}")
    (cls,) = classes
    data = {}
    for name, column in _columns(cls).items():
        values = [getattr(r, name) for r in records]
        if column.encoding == "json":
            values = [None if v is None else _to_json(v) for v in values]
        data[name] = values
    return pa.Table.from_pydict(data, schema=arrow_schema(cls))


def from_arrow(table: pa.Table, cls: type[Record]) -> list[Record]:
    """The records of a table made by `to_arrow` (validated again on the way in).

    A row of an older schema version is upgraded first, from every column the table has (an older
    archive may hold a field the current class renamed); one of a newer version raises
    `UpgradeError` (`schema_too_new`), a ValueError like a row that does not validate.
    """
    columns, current = _columns(cls), current_version(cls)
    versions = table.column("schema_version").to_pylist() if "schema_version" in table.column_names else []
    upgrading = any(v != current for v in versions)
    # Only a row to upgrade needs the columns the class lacks (a renamed field); the rest are Kafka's.
    names = [n for n in table.column_names if upgrading or n in columns]
    data = {}
    for name in names:
        values = table.column(name).to_pylist()
        column = columns.get(name)
        if column is not None and column.encoding == "json":
            values = [None if v is None else json.loads(v) for v in values]
        elif column is not None and column.encoding == "map":
            values = [None if v is None else dict(v) for v in values]
        data[name] = values
    records = []
    for row in zip(*data.values()):
        fields = dict(zip(data, row))
        if fields.get("schema_version", current) != current:
            fields = upgrade(cls.kind, fields, current)
        # Only the class's fields: the rest are the archive's Kafka columns or a query's own.
        records.append(cls.model_validate({k: v for k, v in fields.items() if k in columns}))
    return records
