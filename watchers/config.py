"""The `watchers:` section: registry entries, each checked and built once while the config loads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from undertow.kernel.registry import Component, RegistryError
from undertow.schemas import Record
from undertow.streams import Topics
from undertow.watchers.api import READABLE, WATCHERS, reads_of

Entry = str | dict[str, Any]


@dataclass
class WatcherSpec:
    """One configured watcher: its name (and consumer group), what it reads, how to build it."""

    name: str
    component: Component[Any]
    reads: tuple[str, ...]

    def build(self) -> Any:
        """A fresh watcher: a class instance with empty windows, or the function bound to its kwargs."""
        return self.component.bind()

    def topics(self, namespace: str) -> list[str]:
        return [getattr(Topics(namespace), r) for r in self.reads]

    def record_types(self) -> tuple[type[Record], ...]:
        return tuple(dict.fromkeys(READABLE[r] for r in self.reads))

    def group(self, namespace: str) -> str:
        return f"{namespace}.watcher.{self.name}"


def watcher_specs(entries: list[Entry]) -> list[WatcherSpec]:
    """Every entry resolved, its arguments checked and built once; a ValueError names `watchers.N`."""
    specs: list[WatcherSpec] = []
    for index, entry in enumerate(entries):
        try:
            component = WATCHERS.resolve(entry)
            spec = WatcherSpec(component.name, component, reads_of(component.obj, component.name))
            spec.build()  # the watcher's own checks of its arguments run now, not in the running component
        except (RegistryError, ValueError, TypeError) as e:
            raise ValueError(f"watchers.{index}: {e}") from None
        if any(s.name == spec.name for s in specs):  # each watcher is its own consumer group, named by it
            raise ValueError(f"watchers.{index}: {spec.name!r} is configured twice; its consumer group "
                             f"<namespace>.watcher.{spec.name} would be shared")
        specs.append(spec)
    return specs


def checked_watchers(entries: list[Entry]) -> list[Entry]:
    """For a config validator: the entries unchanged once every one resolves and builds."""
    watcher_specs(entries)
    return entries

