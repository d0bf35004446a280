"""Schema evolution: every record kind has a version; older records are upgraded on read, newer refused.

A record's version is its class's `schema_version` default (1 for every kind today; a kind that
changes shape overrides it: `schema_version: int = 2`). Reading (codec.decode, arrow.from_arrow)
takes the version a record was written with and, while it is older than the class's, applies the
upgrader registered for (kind, that version), each one step, v -> v + 1, then validates the result
as the current class. A record newer than its class is refused (`schema_too_new`: the reader is
older than the writer, and guessing would lose fields); a version that is not an int from 1, or a
gap in the chain of upgraders, is refused as `schema_version`. Each is a DecodeError whose reason
becomes the dead-letter reason on `experiences.rejected`.

An upgrader is a plain function of the record's fields, `fn(fields: dict) -> dict`, registered with
`@upgrader(kind, from_version)`. It sees the fields as plain values, the way both the wire and the
archive give them: per-token arrays the current class packs as lists, JSON fields as dicts and
lists; a field the archive's current schema lacks, or that a newer version added, is absent or None.
It returns the fields of the next version (`schema_version` is set for it).

Example (the first real bump): Experience v2 gained per-token behaviour versions (`token_versions`,
one policy version per response token); its class says `schema_version: int = 2` and beside it
(schemas/experience.py) an `@upgrader("experience", 1)` gives every token of a v1 record the record's
policy_version. tests/fixtures/schemas/v1/experience.bin (the bytes of before) still decodes, and
v2/ holds the bytes of after (tests/schemas/test_versions.py).
"""

from __future__ import annotations

from typing import Any, Callable

Fields = dict[str, Any]
Upgrader = Callable[[Fields], Fields]

# (kind, from_version) -> the function to version from_version + 1; filled by @upgrader at import.
UPGRADERS: dict[tuple[str, int], Upgrader] = {}


class UpgradeError(ValueError):
    """A record whose version cannot be read (`schema_too_new`, `schema_version`), or whose old fields
    its upgrader could not read (`invalid`)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def upgrader(kind: str, from_version: int) -> Callable[[Upgrader], Upgrader]:
    """Decorator: `fn` turns the fields of a `kind` record of `from_version` into those of the next."""

    def register(fn: Upgrader) -> Upgrader:
        key = (kind, from_version)
        if key in UPGRADERS and UPGRADERS[key] is not fn:
            raise TypeError(f"an upgrader of {kind} v{from_version} is already registered: {UPGRADERS[key].__name__}")
        UPGRADERS[key] = fn
        return fn

    return register


def current_version(cls: type) -> int:
    """The version `cls` writes and reads natively: its `schema_version` field's default."""
    return cls.model_fields["schema_version"].default


def check_version(kind: str, version: object, current: int) -> int:
    """`version` if it is one this reader can read (the current one, or an older one), else UpgradeError."""
    if type(version) is not int or version < 1:  # type(): True == 1 in Python, but not on the wire
        expected = "1" if current == 1 else f"1 to {current}"
        raise UpgradeError("schema_version", f"schema_version: expected {expected}, got {version!r}")
    if version > current:
        raise UpgradeError("schema_too_new", f"schema_version: {kind} v{version} is newer than this reader's "
                                             f"v{current}; read it with the undertow that wrote it, or a newer one")
    return version


def upgrade(kind: str, fields: Fields, current: int) -> Fields:
    """`fields` of a `kind` record brought to version `current` through the registered upgraders."""
    version = check_version(kind, fields.get("schema_version"), current)
    while version < current:
        step = UPGRADERS.get((kind, version))
        if step is None:
            raise UpgradeError("schema_version", f"schema_version: {kind} v{version} has no upgrader to "
                                                 f"v{version + 1} (this reader is at v{current})")
        try:
            fields = dict(step(dict(fields)))
        except (KeyError, TypeError, ValueError) as e:  # fields the old version should have had, broken
            raise UpgradeError("invalid", f"upgrading {kind} v{version} to v{version + 1}: {e!r}") from None
        version += 1
        fields["schema_version"] = version
    return fields
