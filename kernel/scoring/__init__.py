"""Model scorers shared by the processors (a `score` stage scorer) and the rollout (a reward): a reward
model and an LLM judge, each taking (prompt, response, reference) items and returning verdicts."""

from undertow.kernel.scoring.base import ERROR, TIMEOUT, UNPARSABLE, Item, ModelScorer, Scored
from undertow.kernel.scoring.judge import LLMJudge
from undertow.kernel.scoring.reward_model import RewardModelScorer

__all__ = ["ERROR", "Item", "LLMJudge", "ModelScorer", "RewardModelScorer", "Scored", "TIMEOUT", "UNPARSABLE"]
