"""Model scorers for the `score` stage: a reward model and an LLM judge (kernel/scoring/), on experiences.

    pipeline: [clean, {name: score, scorer: {name: reward_model, path: /models/rm}}, reshape]

Each gives one reward component under its `name` per experience, and the `score` stage records
`name@version` in `metadata.scored_by` (version: a fingerprint of the model directory, or of the
endpoint and model, and of the rubric). An experience without a verdict goes to the rejected topic:
reason `scorer_timeout` (no verdict within `timeout_s`), `scorer_unparsable` (the judge's answer held
no score), `scorer_error` (the backend failed). The judge's reference answer is `metadata.answer`
when the rollout attached one. The model is loaded on the first batch, on the processor worker's job
thread (streams/faust/worker.py), never on the event loop; scoring runs on the scorer's own threads.
"""

from __future__ import annotations

from undertow.kernel.scoring import Item, LLMJudge, RewardModelScorer
from undertow.schemas import Experience
from undertow.processors.api import Reject
from undertow.processors.score import SCORERS


class _OnExperiences:
    """A kernel scorer called on experiences: `{name: value}` or a Reject per experience."""

    name: str

    def __call__(self, exps: list[Experience]) -> list[dict[str, float] | Reject]:
        items = [Item(e.prompt_text, e.response_text, str(e.metadata.get("answer") or "")) for e in exps]
        return [{self.name: v.value} if v.value is not None else Reject(f"scorer_{v.reason}", v.detail)
                for v in self.score(items)]  # type: ignore[attr-defined]


@SCORERS.register("reward_model")
class RewardModelStage(_OnExperiences, RewardModelScorer):
    """A sequence-classification reward model from a local directory (arguments: RewardModelScorer)."""


@SCORERS.register("llm_judge")
class LLMJudgeStage(_OnExperiences, LLMJudge):
    """An LLM judge, local or an OpenAI-compatible endpoint, with a rubric (arguments: LLMJudge)."""
