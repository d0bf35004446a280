"""Reading a config file, and one error format for every stage: `source: field.path: what was expected`.
The one model of a run file is infra/run/config.py's RunConfig."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Iterable

import yaml
from pydantic import BaseModel, ValidationError


class ConfigError(ValueError):
    """A config file that cannot be read or does not validate; the message names the field."""


def did_you_mean(name: str, choices: Iterable[str]) -> str:
    """" (did you mean 'x'?)" for the closest of `choices` to a misspelt `name`, else ""."""
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def validation_message(source: str, error: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line per problem, naming the field, what was expected and what was given; an unknown key
    of `model` (or of a section inside it) with the nearest valid key."""
    lines = []
    for e in error.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "(top level)"
        got = f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], dict) else ""
        msg = e["msg"].removeprefix("Value error, ")  # pydantic's wrapper of a validator's own message
        if e["type"] == "extra_forbidden" and model is not None:
            msg += did_you_mean(str(e["loc"][-1]), _keys_at(model, e["loc"][:-1]))
        lines.append(f"{source}: {loc}: {msg}{got}")
    return "\n".join(lines)


def _keys_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names of the model found by following `loc` from `model` (list indices skipped)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int):
            continue
        field = getattr(current, "model_fields", {}).get(part)
        if field is None:
            return []
        current = _model_in(field.annotation)
    return list(getattr(current, "model_fields", {}))


def _model_in(annotation: Any) -> Any:
    """The pydantic model inside an annotation such as `X`, `X | None` or `list[X]`, else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`, mappings merged key by key, anything else (a list too) replaced;
    a component entry naming another component ({name: …}) replaces the old one whole, arguments and all."""
    out = dict(base)
    for key, value in override.items():
        old = out.get(key)
        same = isinstance(value, dict) and isinstance(old, dict) and value.get("name", old.get("name")) == old.get("name")
        out[key] = deep_merge(old, value) if same else value
    return out


def load_yaml(path: str | Path) -> dict:
    """A YAML file's top-level mapping."""
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"{path}: cannot read config: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data

