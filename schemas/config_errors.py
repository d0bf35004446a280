"""One format for config errors everywhere: `source: field.path: what was expected (got …)`."""

from __future__ import annotations

from pydantic import ValidationError


def validation_message(source: str, error: ValidationError) -> str:
    """One line per problem, naming the field, what was expected and what was given."""
    lines = []
    for e in error.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        got = f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], dict) else ""
        lines.append(f"{source}: {loc}: {e['msg']}{got}")
    return "\n".join(lines)
