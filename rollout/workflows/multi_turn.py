"""Multi-turn: the policy and an environment take turns until the environment says done.

The trajectory is prompt, then response 1, observation 1, response 2, … Observation tokens stay
in the experience (the policy conditions on them) with loss mask 0: the trainer must not learn to
produce them. Behaviour log-probs of every response token, observations included, come from one
scoring pass over the finished trajectory (schemas.logprobs, like the trainer); causal attention
makes a policy token's log-prob the same as at the time it was sampled.
"""

from __future__ import annotations

from typing import Any, Mapping

from undertow.schemas import Task

from undertow.rollout.workflows.base import Trajectory, WorkflowContext, prompt_tokens, workflow
from undertow.rollout.workflows.environment import Environment, environment_factory


@workflow("multi_turn")
def multi_turn(task: Task, ctx: WorkflowContext, *, environment: str | Mapping[str, Any], max_turns: int = 6,
               observation_format: str = "\nuser: {observation}\nassistant: ") -> list[Trajectory]:
    """`task.group_size` episodes of `environment`, each at most `max_turns` policy turns.

    `observation_format` wraps each observation in the model's turn markers (the default matches the
    tiny model's chat template). Components: the environment's summed reward as "env" plus the
    configured reward on the last response.
    """
    make = environment_factory(environment)
    return [_episode(task, ctx, make(), max_turns, observation_format) for _ in range(task.group_size)]


def _episode(task: Task, ctx: WorkflowContext, env: Environment, max_turns: int, fmt: str) -> Trajectory:
    first = env.reset(task)
    prompt_text, prompt = prompt_tokens(task.model_copy(update={"messages": [], "prompt": first}), ctx)
    tokens: list[int] = []
    mask: list[int] = []
    texts: list[str] = []
    env_reward, finish, last, turns = 0.0, "length", "", 0
    for turns in range(1, max_turns + 1):
        budget = _budget(ctx, prompt, tokens)
        if budget < 1:
            break
        params = ctx.sampling.model_copy(update={"max_new_tokens": min(ctx.sampling.max_new_tokens, budget)})
        sample = ctx.engine.generate([prompt + tokens], 1, params)[0][0]
        tokens += sample.tokens
        mask += [1] * len(sample.tokens)
        texts.append(sample.text)
        last = sample.text
        result = env.step(sample.text)
        env_reward += result.reward
        if result.done:
            finish = "stop"
            break
        if turns == max_turns:  # no turn left to answer it: end on the policy's turn
            break
        observation = fmt.format(observation=result.observation)
        obs_tokens = ctx.engine.tokenizer(observation, add_special_tokens=False)["input_ids"]
        tokens += obs_tokens
        mask += [0] * len(obs_tokens)
        texts.append(observation)
    logprobs = ctx.engine.logprobs(prompt, tokens, ctx.sampling.temperature) if tokens else []
    components = {"env": env_reward, **ctx.reward(last, task)}
    return Trajectory(prompt_text=prompt_text, prompt_tokens=prompt, response_text="".join(texts),
                      response_tokens=tokens, logprobs=logprobs, loss_mask=mask, finish_reason=finish,
                      reward_components=components, metadata={"turns": turns})


def _budget(ctx: WorkflowContext, prompt: list[int], tokens: list[int]) -> int:
    """New tokens still allowed by the model's context length (unbounded models: max_new_tokens)."""
    limit = getattr(ctx.engine, "max_length", None)
    if limit is None:
        return ctx.sampling.max_new_tokens
    return limit - len(prompt) - len(tokens) - 1

