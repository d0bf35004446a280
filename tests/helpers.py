"""Record factories and helpers shared by the tests: one copy of each, imported where needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


def write_config(path: Path, namespace: str, **sections: Any) -> Path:
    """A run config at `path`: the namespace, the tiny model unless `model` is given, and `sections`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"namespace": namespace, "model": {"source": "tiny"}, **sections}))
    return path
