"""`undertow algorithms`: the algorithm presets, and what each sets."""

from __future__ import annotations

import inspect
from typing import Any

from undertow.infra.cli.common import console


def algorithms() -> None:
    """List the algorithm presets (`algorithm: NAME` in a run file) and the settings each makes."""
    from undertow.infra.algorithms import presets

    for name in presets.names():
        fn = presets.get(name)
        options = ", ".join(f"{p.name}={p.default!r}" for p in inspect.signature(fn).parameters.values())
        console.print(f"{name}({options}): {inspect.getdoc(inspect.getmodule(fn)).splitlines()[0]}",
                      highlight=False, markup=False, soft_wrap=True)
        for key, value in flat(fn()):
            console.print(f"    {key}: {value}", highlight=False, markup=False, soft_wrap=True)


def flat(settings: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested sections as dotted keys; a component entry ({name: …}) stays whole."""
    out = []
    for key, value in settings.items():
        if isinstance(value, dict) and "name" not in value:
            out += flat(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out
