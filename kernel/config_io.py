"""Reading a config file, and one error format for every stage: `source: field.path: what was expected`.
The one model of a run file is infra/run/config.py's RunConfig."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError


class ConfigError(ValueError):
    """A config file that cannot be read or does not validate; the message names the field."""


def validation_message(source: str, error: ValidationError) -> str:
    """One line per problem, naming the field, what was expected and what was given."""
    lines = []
    for e in error.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        got = f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], dict) else ""
        msg = e["msg"].removeprefix("Value error, ")  # pydantic's wrapper of a validator's own message
        lines.append(f"{source}: {loc}: {msg}{got}")
    return "\n".join(lines)


def load_yaml(path: str | Path) -> dict:
    """A YAML file's top-level mapping."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read config: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data

