"""Tools without a broker: call parsing, schemas from signatures, and the sandbox (a hanging tool and a
memory hog are killed, every failure becomes text the model reads, the caller goes on)."""

from __future__ import annotations

import time

import pytest

from undertow.kernel.registry import RegistryError
from undertow.rollout.tools import Sandbox, ToolCall, parse_tool_calls, resolve_tools, tool_parsers

CALC = '<tool_call>{"name": "calculator", "arguments": {"expression": "48213*7741"}}</tool_call>'


def test_hermes_parser_finds_calls_and_names_each_malformed_one():
    calls, errors = parse_tool_calls(f"Let me compute. {CALC} and <tool_call>{{oops</tool_call>"
                                     '<tool_call>{"arguments": {}}</tool_call><tool_call>{"name": "f", "arguments": 3}')
    assert calls == [ToolCall("calculator", {"expression": "48213*7741"})]
    assert len(errors) == 3 and "not valid JSON" in errors[0] and "no \"name\"" in errors[1]
    assert "must be an object" in errors[2]  # the unclosed last tag (cut-off output) is still read
    assert tuple(parse_tool_calls("The answer is 42.")) == ([], [])


def test_pythonic_parser_reads_literals_and_never_evaluates():
    parse = tool_parsers.get("pythonic")
    calls, errors = parse("<tool_call>calculator(expression='2*3')</tool_call>"
                          "<tool_call>f(__import__('os'))</tool_call><tool_call>g(x=open('f'))</tool_call>")
    assert calls == [ToolCall("calculator", {"expression": "2*3"})] and len(errors) == 2


def test_schema_from_signature_and_docstring():
    found = resolve_tools(["calculator", "tests.rollout.tool_plugins.boom"])
    assert found["boom"].schema == {"type": "function", "function": {
        "name": "boom", "description": "Raise.", "parameters": {
            "type": "object", "properties": {"text": {"type": "string", "description": "the message of the error"}},
            "required": ["text"]}}}
    assert found["calculator"].signature_line().startswith("calculator(expression: string) - Evaluate")
    with pytest.raises(RegistryError, match="no_docstring"):
        resolve_tools(["tests.rollout.tool_plugins.no_docstring"])


@pytest.fixture(scope="module")
def sandbox():
    names = ["calculator"] + [f"tests.rollout.tool_plugins.{n}" for n in ("hang", "hog", "boom")]
    return Sandbox(resolve_tools(names), timeout_s=1.5, memory_mb=128)


def test_calls_and_their_failures_become_observations(sandbox):
    results = sandbox.run([ToolCall("calculator", {"expression": "48213*7741"}), ToolCall("boom", {"text": "no"}),
                           ToolCall("nope", {}), ToolCall("calculator", {"expr": "1"})])
    assert [(r.kind, r.text) for r in results] == [
        ("ok", "373216833"),  # 48213 * 7741, by hand: 48213*7000 = 337491000, 48213*741 = 35725833
        ("exception", "error: RuntimeError: no"),
        ("unknown_tool", "error: unknown tool 'nope'; tools: boom, calculator, hang, hog"),
        ("bad_arguments", "error: calculator: missing a required argument: 'expression'")]


def test_hanging_tool_is_killed_at_its_timeout_and_the_next_call_works(sandbox):
    started = time.monotonic()
    [hung] = sandbox.run([ToolCall("hang", {"seconds": 60})])
    assert hung.kind == "timeout" and "timed out after 1.5 s" in hung.text
    assert time.monotonic() - started < 30  # killed, not waited for (the call sleeps 60 s)
    assert sandbox.call(ToolCall("calculator", {"expression": "1+1"})).text == "2"


def test_memory_hog_is_stopped_by_its_limit(sandbox):
    result = sandbox.call(ToolCall("hog", {"megabytes": 1024}))
    assert result.kind == "memory" and "memory limit" in result.text
    assert sandbox.call(ToolCall("hog", {"megabytes": 8})).text == str(8 * 2 ** 20)  # under the limit: fine


def test_a_config_naming_an_unknown_tool_or_parser_fails_when_read():
    from pydantic import ValidationError

    from undertow.rollout.config import RolloutConfig

    assert RolloutConfig(workflow={"name": "tool_agent", "tools": ["calculator"]})
    with pytest.raises(ValidationError, match="tool 'calculater': unknown \\(did you mean 'calculator'"):
        RolloutConfig(workflow={"name": "tool_agent", "tools": ["calculater"]})
    with pytest.raises(ValidationError, match="argument parser = 'json'"):
        RolloutConfig(workflow={"name": "tool_agent", "tools": ["calculator"], "parser": "json"})
