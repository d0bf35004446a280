"""Hermes / Qwen-style tool calls in a model's output -> OpenAI's `tool_calls` (pure).

Hermes-format models (Qwen2.5 / Qwen3, Hermes 2 Pro, SmolLM3 …) emit each call as
`<tool_call>{"name": "...", "arguments": {...}}</tool_call>`, the format their chat templates
render calls back in. A block whose JSON does not parse, or lacks a string `name`, is not a call:
it stays in the content, where the agent program sees what the model wrote.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


@dataclass
class ToolCall:
    """One call: the function's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self) -> dict[str, Any]:
        """As OpenAI's chat completion message gives it: arguments as a JSON string."""
        return {"id": self.id, "type": "function",
                "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)}}


@dataclass
class ParsedOutput:
    """The text left once the calls are taken out (None when only whitespace remains), and the calls."""

    content: str | None
    calls: list[ToolCall]


def parse_tool_calls(text: str) -> ParsedOutput:
    """Take every well-formed `<tool_call>{json}</tool_call>` block out of `text`."""
    calls: list[ToolCall] = []
    kept: list[str] = []
    last = 0
    for match in TOOL_CALL.finditer(text):
        call = _call(match.group(1))
        if call is None:
            continue  # malformed: left in the content
        calls.append(call)
        kept.append(text[last:match.start()])
        last = match.end()
    kept.append(text[last:])
    content = "".join(kept).strip() if calls else text
    return ParsedOutput(content=content or None, calls=calls)


def _call(body: str) -> ToolCall | None:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict):
        return None
    return ToolCall(name=obj["name"], arguments=arguments)
