"""Tool calls in a model's text: one parser per call format, Hermes / Qwen-style JSON tags by default.

A parser is `fn(text) -> ParsedCalls`: the well-formed calls, in order, and one error message per
malformed one, so that the model is told what went wrong instead of the episode failing. Pure (no
tools, no engine): the OpenAI-compatible endpoint reuses `parse_tool_calls` to fill `tool_calls`.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from undertow.kernel.registry import Registry


@dataclass
class ToolCall:
    """One call the model asked for."""

    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedCalls:
    """What a parser found in one response: calls, and why each malformed one was refused."""

    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def __iter__(self):  # `calls, errors = parse_tool_calls(text)`
        return iter((self.calls, self.errors))


ToolParser = Callable[[str], ParsedCalls]
tool_parsers: Registry[ToolParser] = Registry("tool parser")

TAG = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.S)  # an unclosed last tag still counts (cut-off output)


@tool_parsers.register("hermes")
def parse_tool_calls(text: str) -> ParsedCalls:
    """Hermes / Qwen2.5 / Qwen3 format: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
    any number of them; text outside the tags is the model's prose."""
    found = ParsedCalls()
    for body in TAG.findall(text):
        try:
            data = json.loads(body.strip())
        except json.JSONDecodeError as e:
            found.errors.append(f"tool call is not valid JSON ({e.msg} at char {e.pos})")
            continue
        if not isinstance(data, dict):
            _add(found, None, None)
            continue
        arguments = data.get("arguments", data.get("parameters", {}))
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        _add(found, data.get("name"), arguments)
    return found


@tool_parsers.register("pythonic")
def parse_pythonic(text: str) -> ParsedCalls:
    """Python call syntax in the same tags, `<tool_call>add(a=1, b=2)</tool_call>` (Llama 3.2's
    "pythonic" calls): literal keyword arguments only, read with `ast`, never evaluated."""
    found = ParsedCalls()
    for body in TAG.findall(text):
        try:
            call = ast.parse(body.strip(), mode="eval").body
            if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Name) or call.args:
                raise ValueError("expected name(key=value, ...)")
            arguments = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        except (SyntaxError, ValueError) as e:
            found.errors.append(f"tool call is not a call name(key=value, ...) ({e})")
            continue
        _add(found, call.func.id, arguments)
    return found


def _add(found: ParsedCalls, name: Any, arguments: Any) -> None:
    if not isinstance(name, str) or not name:
        found.errors.append("tool call has no \"name\"")
    elif not isinstance(arguments, dict):
        found.errors.append(f"tool call {name}: \"arguments\" must be an object")
    else:
        found.calls.append(ToolCall(name, arguments))


# How to call a tool, for templates that do not render tools themselves (the fallback system text).
CALL_FORMATS = {
    "hermes": 'To call a tool, write <tool_call>{"name": NAME, "arguments": {ARG: VALUE}}</tool_call>.',
    "pythonic": "To call a tool, write <tool_call>NAME(ARG=VALUE)</tool_call>.",
}
