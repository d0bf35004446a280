"""Many episodes at once: each turn, one engine call over every live episode of the batch.

A multi-turn workflow is a `react` step, `react(episodes, samples) -> [observation or None]`: what
each episode's environment (or tools) answers to the response just generated, None when it is
over. `run_episodes` batches the turns: every episode still running gets its next response from one
`engine.generate` (one call per distinct token budget, nearly always one), so the engine sees the
whole batch at every turn instead of one sequence. An episode ends on `None`, after `max_turns`
responses, or when its token budget (`max_tokens`, and the model's context) is spent.

Token-in / token-out: an episode's tokens are exactly the engine's sample tokens and the
observation tokens as fed to the engine, never a re-tokenization of the decoded conversation
(which can differ: see tests/rollout/test_agents.py), so the trainer scores what was sampled. Their
behaviour log-probs and policy versions are the samples' own, kept turn by turn: no scoring pass
afterwards (on vLLM at a temperature other than 1 that pass asks for the whole vocabulary at every
position, and a SmolLM2 batch of 32 episodes never finished it), and a turn generated after a weight
swap keeps the version that sampled it.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from undertow.schemas import Task

from undertow.rollout.engines.base import Sample
from undertow.rollout.workflows.base import Trajectory, WorkflowContext


@dataclass
class Episode:
    """One episode in flight: the prompt, then responses (mask 1) and observations (mask 0)."""

    task: Task
    prompt_text: str
    prompt: list[int]
    state: Any = None  # the workflow's own: an environment, the chat so far, ...
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)  # None: a turn came without them
    versions: list[int] | None = field(default_factory=list)  # None: a turn came without them
    texts: list[str] = field(default_factory=list)
    last: str = ""  # the latest response's text
    turns: int = 0
    finish: Literal["stop", "length", "abort"] = "length"
    done: bool = False
    error: Exception | None = None  # the task fails with it
    cut_is_length: bool = True  # False: an environment's "done" makes the episode "stop" even on a cut response
    metadata: dict[str, Any] = field(default_factory=dict)


React = Callable[[list[Episode], list[Sample]], list["str | None"]]


@dataclass
class EpisodeStats:
    """What the engine saw: the number of sequences of each generate call."""

    calls: list[int] = field(default_factory=list)


def run_episodes(episodes: list[Episode], ctx: WorkflowContext, react: React, *, max_turns: int,
                 max_tokens: int | None = None) -> EpisodeStats:
    """Play every episode to its end, one batched engine call per turn (per distinct budget)."""
    stats = EpisodeStats()
    live = [e for e in episodes if not e.done]
    while live:
        by_budget: dict[int, list[Episode]] = defaultdict(list)
        for ep in live:
            budget = min(_room(ctx, ep, max_tokens), ctx.sampling.max_new_tokens)
            if budget < 1:
                ep.done = True  # finish stays "length": out of tokens
            else:
                by_budget[budget].append(ep)
        for budget, group in by_budget.items():
            _turn(group, ctx, react, budget, max_turns, max_tokens, stats)
        live = [e for e in live if not e.done]
    return stats


def _turn(group: list[Episode], ctx: WorkflowContext, react: React, budget: int, max_turns: int,
          max_tokens: int | None, stats: EpisodeStats) -> None:
    """One response for each episode of `group` (one engine call), then each one's observation."""
    params = ctx.sampling.model_copy(update={"max_new_tokens": budget})
    stats.calls.append(len(group))
    try:
        samples = [s[0] for s in ctx.engine.generate([e.prompt + e.tokens for e in group], 1, params)]
        observations = react(group, samples)
    except Exception as e:  # noqa: BLE001 — the engine or a step refused: these tasks fail, the others go on
        for ep in group:
            ep.error, ep.done = e, True
        return
    for ep, sample, observation in zip(group, samples, observations):
        ep.tokens += sample.tokens
        ep.mask += [1] * len(sample.tokens)
        ep.logprobs = _extended(ep.logprobs, sample.logprobs, len(sample.tokens))
        ep.versions = _extended(ep.versions, sample.versions, len(sample.tokens))
        ep.texts.append(sample.text)
        ep.last, ep.turns = sample.text, ep.turns + 1
        if observation is None:  # over: a truncated last response stays "length" (the processors may drop it)
            ep.done, ep.finish = True, "length" if sample.finish_reason == "length" and ep.cut_is_length else "stop"
        elif ep.turns >= max_turns:  # no turn left to answer it: end on the policy's turn
            ep.done = True
        else:
            fed = ctx.engine.tokenizer(observation, add_special_tokens=False)["input_ids"]
            if _room(ctx, ep, max_tokens) - len(fed) < 1:  # no room left to answer it: end on the policy's turn
                ep.done = True
                continue
            ep.tokens += fed
            ep.mask += [0] * len(fed)
            # Not the policy's tokens: masked out of the loss, so their log-prob is never read; their
            # version is the turn's before them, so the oldest version of the episode stays a sampled one.
            ep.logprobs = _extended(ep.logprobs, [0.0] * len(fed), len(fed))
            ep.versions = ep.versions + ep.versions[-1:] * len(fed) if ep.versions else None
            ep.texts.append(observation)


def _extended(kept: list | None, new: list, count: int) -> list | None:
    """`kept` + `new` when `new` has a value for each of the turn's `count` tokens; else None for good."""
    return None if kept is None or len(new) != count else kept + list(new)


def _room(ctx: WorkflowContext, ep: Episode, max_tokens: int | None) -> int:
    """Tokens the episode may still add: the model's context, and its own budget."""
    left = _context_left(ctx, ep)
    return left if max_tokens is None else min(left, max_tokens - len(ep.tokens))


def _context_left(ctx: WorkflowContext, ep: Episode) -> int:
    """New tokens the model's context still holds (an engine without a limit: as many as asked)."""
    limit = getattr(ctx.engine, "max_length", None)
    if limit is None:
        return sys.maxsize
    return limit - len(ep.prompt) - len(ep.tokens) - 1


def trajectory(ep: Episode, components: dict[str, float]) -> Trajectory:
    """A finished episode as a trajectory, with the log-probs and versions its turns were sampled with."""
    return Trajectory(prompt_text=ep.prompt_text, prompt_tokens=ep.prompt, response_text="".join(ep.texts),
                      response_tokens=ep.tokens, logprobs=ep.logprobs or [], loss_mask=ep.mask,
                      finish_reason=ep.finish, reward_components=components, versions=ep.versions or [],
                      metadata={"turns": ep.turns, **ep.metadata})


def by_task(tasks: list[Task], episodes: list[Episode], finish: Callable[[Episode], Trajectory]) -> list[Any]:
    """Each task's trajectories in sample order, or the first error one of its episodes met."""
    outcomes: list[Any] = []
    for task in tasks:
        mine = [e for e in episodes if e.task is task]
        failed = next((e.error for e in mine if e.error is not None), None)
        if failed is None:
            try:
                outcomes.append([finish(e) for e in mine])
                continue
            except Exception as e:  # noqa: BLE001 — a reward that fails on this task
                failed = e
        outcomes.append(failed)
    return outcomes
