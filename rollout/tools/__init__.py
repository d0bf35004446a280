"""Tools a tool-using workflow offers the model: registry and schemas, call parsers, and the sandbox."""

from undertow.rollout.tools.parsers import ParsedCalls, ToolCall, parse_tool_calls, tool_parsers
from undertow.rollout.tools.registry import Tool, resolve_tools, tool, tool_schema, tools
from undertow.rollout.tools.sandbox import ERROR_KINDS, Sandbox, ToolResult
from undertow.rollout.tools import builtin as _builtin  # noqa: F401  (fills the registry)

__all__ = ["ERROR_KINDS", "ParsedCalls", "Sandbox", "Tool", "ToolCall", "ToolResult", "parse_tool_calls",
           "resolve_tools", "tool", "tool_parsers", "tool_schema", "tools"]
