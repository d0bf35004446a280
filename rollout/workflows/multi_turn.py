"""Multi-turn: the policy and an environment take turns until the environment says done.

The trajectory is prompt, then response 1, observation 1, response 2, … Observation tokens stay
in the experience (the policy conditions on them) with loss mask 0: the trainer must not learn to
produce them. Every episode of the batch (all tasks, all samples) plays at once: each turn is one
engine call over the episodes still running (episodes.py). Behaviour log-probs are the ones each
response token was sampled with (schemas.logprobs, like the trainer); observation tokens get 0.0,
never read (mask 0).
"""

from __future__ import annotations

from typing import Any, Mapping

from undertow.schemas import Task

from undertow.rollout.engines.base import Sample
from undertow.rollout.workflows.base import Trajectory, WorkflowContext, prompt_tokens, workflow
from undertow.rollout.workflows.batch import Outcome, batched
from undertow.rollout.workflows.environment import environment_factory
from undertow.rollout.workflows.episodes import Episode, by_task, run_episodes, trajectory

TINY_OBSERVATION = "\nuser: {observation}\nassistant: "


@workflow("multi_turn")
def multi_turn(task: Task, ctx: WorkflowContext, *, environment: str | Mapping[str, Any], max_turns: int = 6,
               max_tokens: int | None = None, observation_format: str = TINY_OBSERVATION) -> list[Trajectory]:
    """`task.group_size` episodes of `environment`, each at most `max_turns` policy turns and
    `max_tokens` response tokens (observations included; null: the model's context).

    `observation_format` wraps each observation in the model's turn markers (the default matches the
    tiny model's chat template). Components: the environment's summed reward as "env" plus the
    configured reward on the last response.
    """
    [outcome] = multi_turn_batch([task], ctx, environment=environment, max_turns=max_turns, max_tokens=max_tokens,
                                 observation_format=observation_format)
    if isinstance(outcome, Exception):
        raise outcome
    return outcome


@batched(multi_turn)
def multi_turn_batch(tasks: list[Task], ctx: WorkflowContext, *, environment: str | Mapping[str, Any],
                     max_turns: int = 6, max_tokens: int | None = None,
                     observation_format: str = TINY_OBSERVATION) -> list[Outcome]:
    """Every episode of every task at once, one engine call per turn."""
    make = environment_factory(environment)
    episodes = [_start(task, ctx, make()) for task in tasks for _ in range(task.group_size)]

    def react(group: list[Episode], samples: list[Sample]) -> list[str | None]:
        observations: list[str | None] = []
        for ep, sample in zip(group, samples):
            try:
                result = ep.state.step(sample.text)
            except Exception as e:  # noqa: BLE001 — this task fails; the batch goes on
                ep.error = e
                observations.append(None)
                continue
            ep.metadata["env_reward"] = ep.metadata.get("env_reward", 0.0) + result.reward
            observations.append(None if result.done else observation_format.format(observation=result.observation))
        return observations

    run_episodes(episodes, ctx, react, max_turns=max_turns, max_tokens=max_tokens)
    return by_task(tasks, episodes, lambda ep: trajectory(
        ep, {"env": ep.metadata.pop("env_reward", 0.0), **ctx.reward(ep.last, ep.task)}))


def _start(task: Task, ctx: WorkflowContext, env: Any) -> Episode:
    try:
        first = env.reset(task)
        text, tokens = prompt_tokens(task.model_copy(update={"messages": [], "prompt": first}), ctx)
    except Exception as e:  # noqa: BLE001 — the task fails with it
        return Episode(task, "", [], done=True, error=e)
    # The environment decides when the game is over: a cut last response still ends it ("stop").
    return Episode(task, text, tokens, state=env, cut_is_length=False)
