"""The tool list and tool results through the model's chat template.

The prompt renders the tools with `apply_chat_template(messages, tools=...)` when the template uses
them (Qwen, Hermes, Llama 3.x, SmolLM3 ...); a template that ignores them (it renders the same text
with and without) gets a short system text instead: one line per tool and how to call one.

A tool result is fed as the template's own turn markers around it: the text the template adds after
an assistant turn once tool messages follow, up to the next assistant prompt. It is computed on a
stand-in conversation (so nothing earlier is re-rendered) and tokenized alone, then appended to the
tokens the engine generated: token-in / token-out.
"""

from __future__ import annotations

from typing import Any

from undertow.rollout.tools.parsers import CALL_FORMATS
from undertow.rollout.tools.registry import Tool

MARK = "XQZJQX"  # stand-in assistant content: text no template adds itself


def tool_prompt(tok: Any, messages: list[dict[str, Any]], tools: dict[str, Tool], parser: str) -> str:
    """The prompt text: the messages with the tools, through the chat template (or the fallback text)."""
    schemas = [t.schema for t in tools.values()]
    if getattr(tok, "chat_template", None):
        plain = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        with_tools = tok.apply_chat_template(messages, tools=schemas, add_generation_prompt=True, tokenize=False)
        if with_tools != plain:
            return with_tools
        return tok.apply_chat_template(with_system_text(messages, tools, parser), add_generation_prompt=True,
                                       tokenize=False)
    return "\n".join(str(m["content"]) for m in with_system_text(messages, tools, parser)) + "\n"


def with_system_text(messages: list[dict[str, Any]], tools: dict[str, Tool], parser: str) -> list[dict[str, Any]]:
    """The fallback: the tools and the call format in the system message (added, or extended)."""
    text = ("Tools: " + "; ".join(t.signature_line() for t in tools.values()) + ". "
            + CALL_FORMATS.get(parser, CALL_FORMATS["hermes"]) + " Give the final answer without a tool call.")
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def observation_text(tok: Any, results: list[str], *, role: str = "tool", ended_with_eos: bool = True) -> str:
    """The text that follows an assistant turn when `results` come back as `role` messages, through to
    the next assistant prompt; starts with the end-of-turn token when the response did not end with it."""
    if not getattr(tok, "chat_template", None):
        return "\n" + "\n".join(f"{role}: {r}" for r in results) + "\n"
    before = [{"role": "user", "content": "q"}, {"role": "assistant", "content": MARK}]
    after = before + [{"role": role, "content": r} for r in results]
    full = tok.apply_chat_template(after, add_generation_prompt=True, tokenize=False)
    cut = full.index(MARK) + len(MARK)
    eos = tok.eos_token or ""
    if ended_with_eos and eos and full.startswith(eos, cut):
        cut += len(eos)  # the engine already produced it
    return full[cut:]
