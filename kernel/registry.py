"""Named components chosen by config: one registry per kind, one syntax for built-ins and plugins.

A config entry is a short name (`grpo`), a dotted path to a user's object
(`my_lab.filters.drop_truncated`), or a mapping with `name` plus that component's own keyword
arguments (`{name: drop_truncated, max_tokens: 2048}`). Plugin code is imported only when a config
names it by dotted path.
"""

from __future__ import annotations

import importlib
import inspect
import typing
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Generic, Mapping, TypeVar

from pydantic import PydanticSchemaGenerationError, TypeAdapter, ValidationError

from undertow.kernel.config_io import did_you_mean

T = TypeVar("T")


class RegistryError(ValueError):
    """A config names a component that does not exist or passes it arguments it does not take."""


@dataclass
class Component(Generic[T]):
    """A resolved config entry: the object and the keyword arguments the config gave it."""

    name: str
    obj: T
    kwargs: dict[str, Any] = field(default_factory=dict)

    def __call__(self, *args: Any) -> Any:
        """Call the object (build the class) with `args` and the config's keyword arguments."""
        return self.obj(*args, **self.kwargs)  # type: ignore[operator]

    def bind(self) -> Any:
        """The component ready to use: a class built once with its keyword arguments (one stateful
        instance, e.g. a running baseline), a function bound to them."""
        return self.obj(**self.kwargs) if inspect.isclass(self.obj) else partial(self.obj, **self.kwargs)  # type: ignore[operator]


class Registry(Generic[T]):
    """Components of one kind (processors, rewards, losses, …) by short name."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        """Decorator: `@rewards.register("exact_match")`."""
        def add(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise RegistryError(f"{self.kind} {name!r} is already registered")
            self._items[name] = obj
            return obj
        return add

    def names(self) -> list[str]:
        return sorted(self._items)

    def get(self, name: str) -> T:
        """A registered component by short name, or any object by dotted path."""
        if name in self._items:
            return self._items[name]
        if "." in name:
            module, _, attr = name.rpartition(".")
            try:
                obj = getattr(importlib.import_module(module), attr)
            except (ImportError, AttributeError) as e:
                raise RegistryError(f"{self.kind} {name!r}: cannot import it ({e})") from None
            if not callable(obj):  # every component is a function or a class
                raise RegistryError(f"{self.kind} {name!r}: expected a function or class, got {type(obj).__name__}")
            return obj
        raise RegistryError(f"{self.kind} {name!r}: unknown{did_you_mean(name, self.names())}; "
                            f"expected one of {self.names()} or a dotted path")

    def resolve(self, entry: str | Mapping[str, Any]) -> Component[T]:
        """A config entry (name, dotted path, or {name: …, **kwargs}) with its arguments checked."""
        if isinstance(entry, str):
            name, kwargs = entry, {}
        elif isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            name, kwargs = entry["name"], {k: v for k, v in entry.items() if k != "name"}
        else:
            raise RegistryError(f"{self.kind}: expected a name or a mapping with 'name', got {entry!r}")
        obj = self.get(name)
        _check_kwargs(self.kind, name, obj, kwargs)
        return Component(name, obj, kwargs)


def entry_name(entry: str | Mapping[str, Any]) -> str:
    """The component a config entry names: the string itself, or its mapping's `name`."""
    return entry if isinstance(entry, str) else str(entry.get("name"))


def _check_kwargs(kind: str, name: str, obj: Any, kwargs: dict[str, Any]) -> None:
    """Refuse arguments the component does not accept, naming them and what it does accept."""
    target = obj.__init__ if inspect.isclass(obj) else obj
    try:
        params = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return
    accepted = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    unknown = sorted(set(kwargs) - accepted)
    if unknown:
        keyword_only = sorted(p.name for p in params if p.kind is p.KEYWORD_ONLY)
        hints = "".join(did_you_mean(u, keyword_only) for u in unknown)
        raise RegistryError(f"{kind} {name!r}: unexpected argument(s) {unknown}{hints}; it takes {keyword_only}")
    for key, expected in _annotations(target, set(kwargs)).items():
        _check_type(kind, name, key, expected, kwargs[key])


def _annotations(target: Any, keys: set[str]) -> dict[str, Any]:
    """The annotations of the parameters in `keys` as types, constraints included (a `DirectoryPath`
    must name a directory); none where they do not resolve (a name imported only for type checkers):
    such an argument is checked by the component when it is built.

    Only those: another parameter's may name `torch.Tensor`, whose evaluation would import torch
    (kernel/lazy.py) in a process that only reads the config. get_type_hints takes them from a bare
    class in the target's module, so that they resolve against the module's names as the target's would.
    """
    raw = {k: v for k, v in getattr(target, "__annotations__", {}).items() if k in keys}
    if not raw:
        return {}
    holder = type("Arguments", (), {"__annotations__": raw, "__module__": getattr(target, "__module__", None)})
    try:
        return typing.get_type_hints(holder, include_extras=True)
    except Exception:  # noqa: BLE001 — any unresolvable annotation: no types to check
        return {}


def _check_type(kind: str, name: str, key: str, expected: Any, value: Any) -> None:
    """Refuse a value of the wrong type (lax, as the config's own fields: 2 is a float, [1] no bool)."""
    try:
        adapter = TypeAdapter(expected)
    except (PydanticSchemaGenerationError, TypeError):  # a type pydantic cannot check: the component does
        return
    try:
        adapter.validate_python(value)
    except ValidationError as e:
        got = e.errors()[0]["msg"]
        raise RegistryError(f"{kind} {name!r}: argument {key} = {value!r}: {got}") from None


def checked_entry(registry: Registry[Any], entry: Any) -> Any:
    """For a config validator: `entry` unchanged once it resolves, else a ValueError saying why, so
    that an unknown name or argument fails while the config is read, not after the model loaded."""
    try:
        registry.resolve(entry)
    except RegistryError as e:
        raise ValueError(str(e)) from None
    return entry
