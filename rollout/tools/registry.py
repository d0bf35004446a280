"""Tools: plain Python functions registered by name (or named in config by dotted path), each with the
JSON schema a chat template renders, made from its signature and Google-style docstring."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from undertow.kernel.registry import Registry, RegistryError, entry_name

tools: Registry[Callable[..., Any]] = Registry("tool")


def tool(name: str) -> Callable:
    """Decorator: `@tool("calculator")` on a module-level function (it runs in a child process, which
    imports it by name). Its docstring's `Args:` section describes each argument to the model."""
    return tools.register(name)


@dataclass
class Tool:
    """A resolved tool: its name as the model calls it, the function, and its JSON schema."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]  # {"type": "function", "function": {"name", "description", "parameters"}}

    def signature_line(self) -> str:
        """`name(arg: type, ...) - description`: the compact form of the fallback system text."""
        spec = self.schema["function"]
        args = ", ".join(f"{k}: {v.get('type', 'any')}" for k, v in spec["parameters"].get("properties", {}).items())
        return f"{self.name}({args}) - {spec.get('description', '').rstrip('.')}".rstrip(" -")


def tool_schema(fn: Callable[..., Any], name: str) -> dict[str, Any]:
    """The function's JSON schema (transformers' `get_json_schema`, the format `apply_chat_template(tools=)`
    takes), named as the config names it."""
    from transformers.utils import get_json_schema  # made for exactly this: signature + docstring -> schema

    try:
        schema = get_json_schema(fn)
    except Exception as e:  # noqa: BLE001 — a docstring without Args:, an untyped argument, ...
        raise RegistryError(f"tool {name!r}: no JSON schema from its signature and docstring ({e})") from None
    schema["function"]["name"] = name
    schema["function"].pop("return", None)
    schema.pop("return", None)
    return schema


def resolve_tools(entries: list[str | Mapping[str, Any]]) -> dict[str, Tool]:
    """Config entries (short name or dotted path) -> tools by the name the model calls them."""
    found: dict[str, Tool] = {}
    for entry in entries:
        if not isinstance(entry, str):
            raise RegistryError(f"tool {entry!r}: name a tool by short name or dotted path")
        fn = tools.get(entry)
        name = entry_name(entry).rpartition(".")[2]
        if name in found:
            raise RegistryError(f"tool {name!r} is listed twice")
        found[name] = Tool(name, fn, tool_schema(fn, name))
    return found
