"""The `feeder`, `rollout` and `eval` sections of a run's YAML config (the whole file's model is
infra/run/config.py's RunConfig)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from undertow.kernel.registry import checked_entry, entry_name

from undertow.rollout.engines import engines
from undertow.rollout.engines.base import SamplingParams
from undertow.rollout.feeder.selectors import selectors
from undertow.rollout.rewards import rewards
from undertow.rollout.workflows import workflows

Entry = str | dict[str, Any]  # a registry entry: `name`, dotted path, or {name: …, **kwargs}


def rollout_group(namespace: str, configured: str | None = None) -> str:
    """The rollout workers' consumer group on the tasks topic (the feeder measures its lag): the
    `consumer_group` a config names, else the namespace's."""
    return configured or f"{namespace}.rollout"


class TasksetConfig(BaseModel):
    """One taskset of the mix."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="taskset name: Task.taskset and task id prefix")
    source: Entry = Field(description="taskset source: jsonl, parquet, hf_disk, arithmetic, countdown, or dotted path")
    ratio: float = Field(1.0, gt=0, description="share of the draws, relative to the other tasksets")
    group_size: int | None = Field(None, ge=1, description="samples per task (default: feeder.group_size)")


class FeederConfig(BaseModel):
    """`feeder:` — what goes onto the tasks topic, and how fast."""

    model_config = ConfigDict(extra="forbid")

    tasksets: list[TasksetConfig] = Field(
        default_factory=lambda: [TasksetConfig(name="arith", source="arithmetic")],
        min_length=1, description="tasksets mixed by ratio")
    seed: int = Field(0, description="seed of the selectors' draws")
    epochs: int | None = Field(1, ge=1, description="passes over each taskset (null: forever)")
    selector: Entry = Field("shuffle", description="which item next (rollout/feeder/selectors.py): sequential, "
                                                   "shuffle, easy_to_hard, difficulty, bots, or dotted path (+ kwargs)")
    group_size: int = Field(4, ge=1, description="samples per task unless the taskset says otherwise")
    max_lag: int = Field(32, ge=1, description="most tasks waiting for the rollout group; the feeder pauses above it")
    consumer_group: str | None = Field(None, description="rollout group whose lag is bounded (default <namespace>.rollout)")
    poll_seconds: float = Field(0.2, gt=0, description="pause between lag checks while the topic is full")

    @field_validator("selector")
    @classmethod
    def _check_selector(cls, v: Entry) -> Entry:
        checked_entry(selectors, v)
        selectors.resolve(v)()  # its settings checked now, not when the feeder starts
        return v


class RolloutConfig(BaseModel):
    """`rollout:` — how workers turn tasks into experiences."""

    model_config = ConfigDict(extra="forbid")

    engine: Entry = Field("transformers", description="inference engine: transformers, vllm, or dotted path (+ kwargs)")
    sampling: SamplingParams = Field(default_factory=SamplingParams, description="temperature, top_p, max_new_tokens")
    workflow: Entry = Field("single_turn", description="single_turn, multi_turn (+ environment), tool_agent (+ tools), "
                                                        "or dotted path")
    reward: Entry = Field("numeric_match", description="reward function (see rollout.rewards) or dotted path")
    reward_timeout_s: float | None = Field(
        30.0, gt=0, description="longest a reward call may take; past it the task goes to the rejected topic with "
                                "reason timeout (null: wait for ever)")
    chat_template: bool = Field(True, description="wrap plain prompts as a user message in the chat template")
    batch_tasks: int = Field(
        8, ge=1, le=1024, description="most ready tasks a worker generates in one engine call (multi-turn workflows: "
                                      "every episode of the batch in each turn's call)")
    workers: int = Field(1, ge=1, description="worker processes in the consumer group")
    consumer_group: str | None = Field(None, description="consumer group on the tasks topic (default <namespace>.rollout)")
    max_inflight: int = Field(64, ge=1, le=65536, description="sequences a worker keeps in a continuously batching "
                              "engine (vllm_async): the next task is admitted as soon as its group fits")
    max_staleness: int = Field(1, ge=0, description="policy versions a worker may lag the trainer's latest (0: on-policy)")
    experiences_per_version: int | None = Field(
        None, ge=1, description="B of AReaL's admission rule: by trainer version L a worker publishes at most "
                                "(L - L0 + max_staleness + 1) * B experiences, L0 the version it first saw (null: no cap)")
    cap_wait_s: float | None = Field(
        300.0, gt=0, description="seconds a capped worker waits for a new trainer version before its budget "
                                 "grows by (max_staleness + 1) * B (the trainer may have had nothing to train on); "
                                 "null: wait for ever")
    weights_wait_seconds: float = Field(0.05, gt=0, description="pause between checks while admission control waits")
    greedy_baseline: bool = Field(False, description="also generate one greedy answer per task, scored like the "
                                                     "samples and never trained: its reward goes into each sample's "
                                                     "metadata (baseline_reward), ReMax's baseline")

    @model_validator(mode="after")
    def _the_workflow_makes_greedy_baselines(self) -> "RolloutConfig":
        if self.greedy_baseline and not getattr(workflows.resolve(self.workflow).obj, "greedy_baseline", False):
            raise ValueError(f"greedy_baseline: workflow {entry_name(self.workflow)} does not generate a greedy "
                             f"baseline answer (single_turn does)")
        return self

    _check_engine = field_validator("engine")(lambda cls, v: checked_entry(engines, v))
    _check_workflow = field_validator("workflow")(lambda cls, v: checked_entry(workflows, v))
    _check_reward = field_validator("reward")(lambda cls, v: checked_entry(rewards, v))

    @model_validator(mode="after")
    def _logprobs_match_the_trainer(self) -> "RolloutConfig":
        """An engine whose recorded log-probs would differ from the trainer's recomputation is refused."""
        engine = engines.resolve(self.engine).obj
        if hasattr(engine, "check_sampling"):  # a plugin engine need not say
            engine.check_sampling(self.sampling)
        return self


class EvalConfig(BaseModel):
    """`eval:` — held-out tasksets scored on every `every`-th policy version (none: no evaluator)."""

    model_config = ConfigDict(extra="forbid")

    tasksets: list[TasksetConfig] = Field(default_factory=list, description="held-out tasksets (none: no evaluation)")
    every: int = Field(10, ge=1, description="evaluate each policy version that is a multiple of this (and the first "
                                             "and the last the evaluator sees)")
    greedy: bool = Field(True, description="score one greedy answer per task (greedy accuracy)")
    samples: int = Field(0, ge=0, description="sampled answers per task for pass@k (0: none)")
    temperature: float = Field(1.0, gt=0, description="temperature of the sampled answers")
    max_new_tokens: int | None = Field(None, ge=1, description="longest answer (default: rollout.sampling's)")
    success_threshold: float = Field(1.0, description="an answer whose reward is at least this counts as correct")
    max_tasks: int | None = Field(None, ge=1, description="score at most this many tasks of each taskset")
    max_overlap: float = Field(0.01, ge=0, le=1, description=(
        "largest share of a held-out taskset's prompts that the feeder's tasksets may also draw; `undertow run` "
        "refuses a config above it (1.0: evaluating on training tasks, knowingly)"))
    stop_timeout_s: float = Field(600.0, gt=0, description="how long `undertow run` waits, when a stage ends, for the "
                                                           "evaluation of its last weights before killing the evaluator")

    @model_validator(mode="after")
    def _something_to_score(self) -> "EvalConfig":
        if self.samples == 0 and not self.greedy:
            raise ValueError("samples: with greedy: false, samples must be >= 1 (nothing would be scored)")
        return self


