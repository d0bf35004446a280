"""A model's output as OpenAI's chat message: the text, and the well-formed tool calls taken out of it.

The calls are read by the tool parsers the agent workflows use (rollout/tools/parsers.py, Hermes /
Qwen-style `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` by default). A block that does
not parse stays in the content, where the agent program sees what the model wrote.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from undertow.rollout.tools.parsers import TAG, parse_tool_calls


@dataclass
class OpenAIToolCall:
    """One call with the id OpenAI's format gives it."""

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
    calls: list[OpenAIToolCall]


def split_tool_calls(text: str) -> ParsedOutput:
    """Take every well-formed tool call block out of `text`."""
    calls: list[OpenAIToolCall] = []
    kept: list[str] = []
    last = 0
    for match in TAG.finditer(text):
        found = parse_tool_calls(match.group(0)).calls
        if not found:
            continue  # malformed: left in the content
        calls += [OpenAIToolCall(c.name, c.arguments) for c in found]
        kept.append(text[last:match.start()])
        last = match.end()
    kept.append(text[last:])
    content = "".join(kept).strip() if calls else text
    return ParsedOutput(content=content or None, calls=calls)
