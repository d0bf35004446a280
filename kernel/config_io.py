"""Reading a config file, and one error format for every stage: `source: field.path: what was expected`."""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


class ConfigError(ValueError):
    """A config file that cannot be read or does not validate; the message names the field."""


def validation_message(source: str, error: ValidationError) -> str:
    """One line per problem, naming the field, what was expected and what was given."""
    lines = []
    for e in error.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        got = f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], dict) else ""
        lines.append(f"{source}: {loc}: {e['msg']}{got}")
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


def load_config(path: str | Path, model: type[M]) -> M:
    """A YAML file validated as `model`; errors name the field and what was expected."""
    try:
        return model.model_validate(load_yaml(path))
    except ValidationError as e:
        raise ConfigError(validation_message(str(path), e)) from None
