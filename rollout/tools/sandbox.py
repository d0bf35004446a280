"""Tool calls run in a child process with a wall-clock timeout and an address-space limit.

A tool is user code: it may hang, eat memory or raise. Each call runs in a process forked from a
small forkserver (never from the worker, whose model and threads a fork would copy), under
RLIMIT_AS = its own size at start + `memory_mb`; a call past `timeout_s` is killed. Every outcome
is a `ToolResult` whose text the model reads next, with a `kind` the metrics count; nothing raises.
"""

from __future__ import annotations

import inspect
import multiprocessing
import resource
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from undertow.rollout.tools.parsers import ToolCall
from undertow.rollout.tools.registry import Tool

Kind = Literal["ok", "malformed", "unknown_tool", "bad_arguments", "exception", "timeout", "memory", "crashed"]
IMPORT_TIMEOUT_S = 60.0  # longest a child may take to import its tool before the call starts
STARTED = ("started", "")
ERROR_KINDS: tuple[str, ...] = ("malformed", "unknown_tool", "bad_arguments", "exception", "timeout", "memory",
                                "crashed")


@dataclass
class ToolResult:
    """What one call came to: the observation text and how it ended."""

    name: str
    kind: Kind
    text: str


class Sandbox:
    """Runs tool calls in child processes; `timeout_s` and `memory_mb` bound each call."""

    def __init__(self, tools: dict[str, Tool], *, timeout_s: float = 5.0, memory_mb: int = 256,
                 max_chars: int = 2000):
        self.tools, self.timeout_s, self.memory_mb, self.max_chars = tools, timeout_s, memory_mb, max_chars
        self._mp = multiprocessing.get_context("forkserver")

    def run(self, calls: list[ToolCall]) -> list[ToolResult]:
        """Every call at once (a hanging one costs its timeout once, not once per call), in order."""
        if len(calls) <= 1:
            return [self.call(c) for c in calls]
        with ThreadPoolExecutor(max_workers=min(len(calls), 16)) as pool:
            return list(pool.map(self.call, calls))

    def call(self, call: ToolCall) -> ToolResult:
        """One call: its result, or the error the model should see."""
        found = self.tools.get(call.name)
        if found is None:
            return ToolResult(call.name, "unknown_tool",
                              f"error: unknown tool {call.name!r}; tools: {', '.join(sorted(self.tools))}")
        try:
            inspect.signature(found.fn).bind(**call.arguments)
        except TypeError as e:
            return ToolResult(call.name, "bad_arguments", f"error: {call.name}: {e}")
        return self._in_child(found, call.arguments)

    def _in_child(self, found: Tool, arguments: dict[str, Any]) -> ToolResult:
        receive, send = self._mp.Pipe(duplex=False)
        child = self._mp.Process(target=_child, args=(send, found.fn, arguments, self.memory_mb * 2 ** 20),
                                 daemon=True)
        try:
            child.start()
        except Exception as e:  # noqa: BLE001 — e.g. a function pickle cannot send (a lambda)
            return ToolResult(found.name, "crashed", f"error: {found.name} could not start ({type(e).__name__}: {e})")
        send.close()
        try:
            # The clock starts once the child has imported the tool: `timeout_s` bounds the call itself.
            if not receive.poll(IMPORT_TIMEOUT_S):
                kind, text = "timeout", f"error: {found.name} did not start within {IMPORT_TIMEOUT_S:g} s"
            elif receive.recv() != STARTED:
                kind, text = "crashed", f"error: {found.name} crashed"
            elif receive.poll(self.timeout_s):
                kind, text = receive.recv()
            else:
                kind, text = "timeout", f"error: {found.name} timed out after {self.timeout_s:g} s"
        except EOFError:  # died without a word: killed by a signal, or os._exit
            kind, text = "crashed", f"error: {found.name} crashed"
        finally:
            receive.close()
            if child.is_alive():
                child.kill()
            child.join(timeout=5)
        if kind == "crashed" and child.exitcode is not None and child.exitcode < 0:
            text += f" (signal {-child.exitcode})"
        return ToolResult(found.name, kind, text[:self.max_chars])


def _child(conn: Any, fn: Any, arguments: dict[str, Any], memory_bytes: int) -> None:
    """In the child: cap the address space, call, send (kind, text) back."""
    if memory_bytes > 0:
        with open("/proc/self/statm") as f:  # pages of address space in use now (the imports done)
            used = int(f.read().split()[0]) * resource.getpagesize()
        resource.setrlimit(resource.RLIMIT_AS, (used + memory_bytes, used + memory_bytes))
    conn.send(STARTED)
    try:
        result = fn(**arguments)
        conn.send(("ok", result if isinstance(result, str) else repr(result)))
    except MemoryError:
        conn.send(("memory", f"error: {getattr(fn, '__name__', 'tool')} exceeded its memory limit"))
    except BaseException as e:  # noqa: BLE001 — the model sees what its call raised
        conn.send(("exception", f"error: {type(e).__name__}: {e}"))
    finally:
        conn.close()
