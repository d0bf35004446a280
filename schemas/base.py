"""The Record base class, the kind registry, and the field types records share."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1  # every kind's first version; a kind's current one is its schema_version default (versions.py)
MAX_TOKENS = 1 << 20  # tokens per sequence
MAX_TEXT_CHARS = 4 << 20  # characters per text field
FLOAT32_MAX = 3.4028234663852886e38  # packed float arrays are fp32 on the wire (see codec.py)


@dataclass(frozen=True)
class Packed:
    """Marks a list field that the codec sends as compact little-endian binary of `dtype`."""

    dtype: str  # numpy dtype string, explicit byte order: "<i4", "<u1", "<f4"


# Field types. Constraints live on the type, so every record that uses one gets the same rule.
Id = Annotated[str, Field(min_length=1, max_length=256)]
Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
# An fp32-range finite float: a larger value would turn into inf when packed.
Finite32 = Annotated[float, Field(allow_inf_nan=False, ge=-FLOAT32_MAX, le=FLOAT32_MAX)]
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
TokenIds = Annotated[list[TokenId], Field(max_length=MAX_TOKENS), Packed("<i4")]
Mask = Annotated[list[Annotated[int, Field(ge=0, le=1)]], Field(max_length=MAX_TOKENS), Packed("<u1")]
Floats32 = Annotated[list[Finite32], Field(max_length=MAX_TOKENS), Packed("<f4")]
# A log-prob is <= 0; the small slack absorbs rounding in engines that report exp/log round trips.
LogProb = Annotated[float, Field(allow_inf_nan=False, ge=-FLOAT32_MAX, le=1e-6)]
LogProbs = Annotated[list[LogProb], Field(max_length=MAX_TOKENS), Packed("<f4")]
UnixTime = Annotated[float, Field(default_factory=time.time, allow_inf_nan=False)]

_REGISTRY: dict[str, type[Record]] = {}  # kind -> class; written only at class creation


class Record(BaseModel):
    """Base of every record on a topic. Subclasses set `kind`, which registers them."""

    model_config = ConfigDict(extra="forbid", frozen=False)

    kind: ClassVar[str]
    id_field: ClassVar[str | None] = None  # the field that identifies one record, if any

    # What this class writes; a kind that changes shape overrides the default and registers an
    # upgrader from the version before (versions.py), so that older records still read.
    schema_version: int = SCHEMA_VERSION

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: object) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        kind = cls.__dict__.get("kind")
        if kind is None:  # an abstract intermediate class, or a test helper: not on the wire
            return
        if kind in _REGISTRY and _REGISTRY[kind] is not cls:
            raise TypeError(f"record kind {kind!r} already registered by {_REGISTRY[kind].__name__}")
        _REGISTRY[kind] = cls


def record_types() -> dict[str, type[Record]]:
    """Every registered record class by kind (a copy)."""
    return dict(_REGISTRY)


def record_type(kind: str) -> type[Record] | None:
    """The class registered for `kind`, or None."""
    return _REGISTRY.get(kind)

