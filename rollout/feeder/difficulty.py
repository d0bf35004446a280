"""Difficulty scoring by a local model: each task's pass rate under it, through undertow's engine.

    model_pass_rate_i = c_i / n      c_i of task i's n sampled answers score >= success_threshold

Prompts are formed and answers scored as the rollout workers form and score them (chat template or
not, the same reward), so a pass rate here means what a training reward means. `undertow prepare`
writes it as a metadata column of the prepared taskset; the feeder's `easy_to_hard` selector orders
by it (`{by: model_pass_rate, higher_is_easier: true}`), and a filter on it is one line of SQL or a
`drop_pass_rates` bound here (tasks the model always or never solves teach GRPO nothing).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator

from undertow.kernel.models import ModelSpec
from undertow.kernel.progress import progress
from undertow.schemas import Task

from undertow.rollout.config import RolloutConfig
from undertow.rollout.engines import build_engine
from undertow.rollout.evaluation import BATCH_PROMPTS, wrong_when_unscored
from undertow.rollout.feeder.items import TaskItem
from undertow.rollout.rewards import build_reward, total
from undertow.rollout.workflows import WorkflowContext
from undertow.rollout.workflows.base import prompt_tokens


class DifficultyConfig(BaseModel):
    """`difficulty:` of a prepare file: the model, how it answers, and how answers are scored."""

    model_config = ConfigDict(extra="forbid")

    model: ModelSpec = Field(description="the scoring model (a run's `model:` section: tiny, hf, gguf)")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description=(
        "engine, sampling, reward and chat_template, as a run's `rollout:` section gives them"))
    samples: int = Field(8, ge=1, description="sampled answers per task")
    success_threshold: float = Field(1.0, description="an answer passes when its reward is at least this")
    column: str = Field("model_pass_rate", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                        description="the metadata column the pass rate is written to")
    keep_between: tuple[float, float] | None = Field(None, description=(
        "drop tasks whose pass rate is outside [low, high] (e.g. [0.05, 0.95]: always or never solved)"))

    @model_validator(mode="after")
    def _bounds(self) -> "DifficultyConfig":
        if self.keep_between and not 0 <= self.keep_between[0] <= self.keep_between[1] <= 1:
            raise ValueError(f"keep_between: expected 0 <= low <= high <= 1, got {list(self.keep_between)}")
        return self


def pass_rates(items: list[TaskItem], cfg: DifficultyConfig) -> list[float]:
    """Each item's pass rate over `cfg.samples` answers of the model (in the items' order)."""
    engine = build_engine(cfg.rollout.engine, cfg.model)
    reward = wrong_when_unscored(build_reward(cfg.rollout.reward, timeout_s=cfg.rollout.reward_timeout_s))
    ctx = WorkflowContext(engine=engine, sampling=cfg.rollout.sampling, reward=reward,
                          chat_template=cfg.rollout.chat_template)
    params = cfg.rollout.sampling.model_copy(update={"logprobs": False})  # answers are scored, not trained on
    tasks = [Task(task_id=i.key, prompt=i.prompt, messages=i.messages, answer=i.answer, taskset="prepare",
                  metadata=i.metadata) for i in items]
    rates: list[float] = []
    with progress("difficulty", total=len(tasks), unit="tasks") as bar:
        for start in range(0, len(tasks), BATCH_PROMPTS):
            batch = tasks[start:start + BATCH_PROMPTS]
            answers = engine.generate([prompt_tokens(t, ctx)[1] for t in batch], cfg.samples, params)
            for task, samples in zip(batch, answers):
                passed = sum(total(reward(s.text, task)) >= cfg.success_threshold for s in samples)
                rates.append(passed / len(samples))
            bar.advance(len(batch))
    return rates
