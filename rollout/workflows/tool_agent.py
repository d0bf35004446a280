"""Tool use: the policy calls tools until it answers without a call; results come back as observations.

Each response is parsed for tool calls (`parser`: hermes by default, tools/parsers.py); calls run in
the sandbox (a child process each, with a timeout and a memory limit) and their results, or what went
wrong (malformed call, unknown tool, bad arguments, exception, timeout, memory), are fed back as tool
messages with loss mask 0. A response without a call ends the episode and is scored by the reward.
Episodes of the whole batch play at once (episodes.py); each trajectory's metadata counts its calls
by outcome (`tools: {ok: 2, timeout: 1}`), which the worker adds up into its metrics.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator

from undertow.schemas import Task

from undertow.rollout.engines.base import Sample
from undertow.rollout.tools import Sandbox, ToolResult, resolve_tools, tool_parsers
from undertow.rollout.tools.chat import observation_text, tool_prompt
from undertow.rollout.workflows.base import Trajectory, WorkflowContext, workflow
from undertow.rollout.workflows.batch import Outcome, batched
from undertow.rollout.workflows.episodes import Episode, by_task, run_episodes, trajectory


def _known_tools(names: list[str]) -> list[str]:
    resolve_tools(names)  # an unknown tool or one without a schema fails when the config is read
    return names


def _known_parser(name: str) -> str:
    tool_parsers.get(name)
    return name


# The registry checks a workflow's arguments against these annotations when the config is read.
ToolNames = Annotated[list[str], AfterValidator(_known_tools)]
ParserName = Annotated[str, AfterValidator(_known_parser)]


@workflow("tool_agent")
def tool_agent(task: Task, ctx: WorkflowContext, *, tools: ToolNames, parser: ParserName = "hermes", max_turns: int = 4,
               max_tokens: int | None = None, timeout_s: float = 5.0, memory_mb: int = 256,
               max_result_chars: int = 1000, observation_role: str = "tool",
               examples: list[dict[str, str]] | None = None) -> list[Trajectory]:
    """`task.group_size` episodes with `tools` (names or dotted paths), each at most `max_turns`
    responses and `max_tokens` response tokens (results included; null: the model's context); each
    call at most `timeout_s` seconds and `memory_mb` MiB beyond the child's own size. `examples`: chat
    messages of a worked episode (user, assistant's call, tool result, answer) put before every
    task's own, few-shot: a small model that describes a tool in prose copies a call it was shown."""
    [outcome] = tool_agent_batch([task], ctx, tools=tools, parser=parser, max_turns=max_turns, max_tokens=max_tokens,
                                 timeout_s=timeout_s, memory_mb=memory_mb, max_result_chars=max_result_chars,
                                 observation_role=observation_role, examples=examples)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


@batched(tool_agent)
def tool_agent_batch(tasks: list[Task], ctx: WorkflowContext, *, tools: ToolNames, parser: ParserName = "hermes",
                     max_turns: int = 4, max_tokens: int | None = None, timeout_s: float = 5.0, memory_mb: int = 256,
                     max_result_chars: int = 1000, observation_role: str = "tool",
                     examples: list[dict[str, str]] | None = None) -> list[Outcome]:
    """Every episode of every task at once: one engine call per turn, the turn's tool calls in parallel."""
    found = resolve_tools(tools)
    parse = tool_parsers.get(parser)
    sandbox = Sandbox(found, timeout_s=timeout_s, memory_mb=memory_mb, max_chars=max_result_chars)
    tok = ctx.engine.tokenizer
    episodes = [_start(task, tok, found, parser, examples or []) for task in tasks for _ in range(task.group_size)]

    def react(group: list[Episode], samples: list[Sample]) -> list[str | None]:
        parsed = [parse(s.text) for s in samples]
        results = iter(sandbox.run([c for p in parsed for c in p.calls]))  # every call of the turn at once
        observations: list[str | None] = []
        for ep, sample, p in zip(group, samples, parsed):
            outcome = [ToolResult("", "malformed", f"error: {m}") for m in p.errors] + [next(results) for _ in p.calls]
            for r in outcome:
                ep.metadata["tools"][r.kind] = ep.metadata["tools"].get(r.kind, 0) + 1
            if not outcome:
                observations.append(None)  # an answer: the episode is over
                continue
            eos = bool(sample.tokens) and sample.tokens[-1] == tok.eos_token_id
            observations.append(observation_text(tok, [r.text for r in outcome], role=observation_role,
                                                 ended_with_eos=eos))
        return observations

    run_episodes(episodes, ctx, react, max_turns=max_turns, max_tokens=max_tokens)
    return by_task(tasks, episodes, lambda ep: trajectory(ep, ctx.reward(ep.last, ep.task)))


def _start(task: Task, tok: Any, found: dict, parser: str, examples: list[dict[str, str]]) -> Episode:
    messages = [*examples, *(task.messages or [{"role": "user", "content": task.prompt}])]
    try:
        text = tool_prompt(tok, messages, found, parser)
    except Exception as e:  # noqa: BLE001 — messages the template refuses: this task fails
        return Episode(task, "", [], done=True, error=e)
    return Episode(task, text, tok(text, add_special_tokens=False)["input_ids"], metadata={"tools": {}})
