"""Rewards from models: a reward model and an LLM judge (kernel/scoring/) as rollout rewards.

    rollout: {reward: {name: rollout_llm_judge, path: /models/judge, verdict: labels}}

The same scorers as the processors' `reward_model` and `llm_judge` (processors/scorers.py), under
names of their own (no two registered rewards or scores share a name). The reward contract scores
one response per call, so each sample of a group is one model call (one forward pass or request);
for batches of many responses per forward pass, score in the processors instead. Verdicts are cached
by content hash, so a response seen again costs nothing. A response with no verdict (no answer
within `timeout_s`, an unparsable answer, a failing backend) fails its task, which the worker sends
to the rejected topic with the reason `scorer_timeout`, `scorer_unparsable` or `scorer_error`.
"""

from __future__ import annotations

from undertow.kernel.scoring import Item, LLMJudge, RewardModelScorer
from undertow.schemas import Task

from undertow.rollout.rewards.registry import NoVerdict, rewards  # noqa: F401 — NoVerdict: importable from here too


def task_prompt(task: Task) -> str:
    """The question the response answers: the plain prompt, else the last user message."""
    if task.prompt:
        return task.prompt
    users = [m["content"] for m in task.messages if m.get("role") == "user"]
    return users[-1] if users else ""


class _OnResponse:
    """A kernel scorer as a reward: `{name: value}` for one response, or NoVerdict."""

    name: str
    own_deadline = True  # the scorer waits at most its `timeout_s` (and loads its model first): no second deadline

    def __call__(self, response: str, task: Task) -> dict[str, float]:
        verdict = self.score([Item(task_prompt(task), response, task.answer or "")])[0]  # type: ignore[attr-defined]
        if verdict.value is None:
            raise NoVerdict(f"scorer_{verdict.reason}", verdict.detail)
        return {self.name: verdict.value}


@rewards.register("rollout_reward_model")
class RolloutRewardModel(_OnResponse, RewardModelScorer):
    """A sequence-classification reward model from a local directory (arguments: RewardModelScorer)."""


@rewards.register("rollout_llm_judge")
class RolloutLLMJudge(_OnResponse, LLMJudge):
    """An LLM judge, local or an OpenAI-compatible endpoint, with a rubric (arguments: LLMJudge)."""
