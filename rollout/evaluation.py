"""Held-out evaluation: a policy's greedy accuracy, pass@k, reward and answer length on tasksets it
never trains on. Pure of Kafka: `Evaluator.evaluate()` scores the weights its engine holds;
rollout/eval_runner.py follows the weights topic and publishes what this returns.

    greedy accuracy = 1/N Σ_i 1[r(greedy answer_i) ≥ τ]
    pass@k          = 1/N Σ_i 1 − C(n − c_i, k) / C(n, k)     n samples of task i, c_i of them correct
                                                              (Chen et al. 2021, "Evaluating Large
                                                              Language Models Trained on Code", eq. 1)
Prompts are formed as the rollout workers form them (chat template or not) and answers scored by
the same reward, so held-out numbers and training rewards mean the same thing.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from math import comb

from undertow.kernel.progress import Bar, progress
from undertow.schemas import EvalResult, Task

from undertow.rollout.config import EvalConfig, RolloutConfig, TasksetConfig
from undertow.rollout.engines import Engine, SamplingParams
from undertow.rollout.contamination import heldout_items
from undertow.rollout.rewards import RewardFn, build_reward, total
from undertow.rollout.rewards.registry import NoVerdict
from undertow.rollout.workflows import WorkflowContext
from undertow.rollout.workflows.base import prompt_tokens

BATCH_PROMPTS = 64  # prompts per engine call: the engine batches them


def pass_at_k(n: int, correct: int, k: int) -> float:
    """The unbiased pass@k estimate from `n` samples of which `correct` passed (k <= n)."""
    if not 1 <= k <= n:
        raise ValueError(f"pass@k: need 1 <= k <= n, got k={k}, n={n}")
    if n - correct < k:
        return 1.0
    return 1.0 - comb(n - correct, k) / comb(n, k)


def ks_for(samples: int) -> list[int]:
    """The k reported for n samples: 1 and n (and 1 alone for n = 1)."""
    return sorted({1, samples}) if samples else []


log = logging.getLogger(__name__)


@dataclass
class HeldOut:
    """One held-out taskset as tasks ready to prompt."""

    name: str
    tasks: list[Task]


def load_heldout(cfg: TasksetConfig, max_tasks: int | None) -> HeldOut:
    """A taskset's items as tasks; a source without reference answers cannot be scored."""
    items = heldout_items(cfg, max_tasks)
    unanswered = [i.key for i in items if i.answer is None]
    if unanswered:
        raise ValueError(f"eval.tasksets {cfg.name!r}: items {unanswered[:3]} have no answer to score against")
    return HeldOut(cfg.name, [Task(task_id=f"{cfg.name}/{i.key}", prompt=i.prompt, messages=i.messages,
                                   answer=i.answer, taskset=cfg.name, metadata=i.metadata) for i in items])


class Evaluator:
    """Scores the engine's current weights on every held-out taskset."""

    def __init__(self, engine: Engine, rollout: RolloutConfig, cfg: EvalConfig, model: str):
        self.engine, self.cfg, self.model = engine, cfg, model
        self.reward: RewardFn = wrong_when_unscored(build_reward(rollout.reward, timeout_s=rollout.reward_timeout_s))
        self.ctx = WorkflowContext(engine=engine, sampling=rollout.sampling, reward=self.reward,
                                   chat_template=rollout.chat_template)
        longest = cfg.max_new_tokens or rollout.sampling.max_new_tokens
        # Rewards need answers, not log-probs: the engines skip computing them (a forward pass per batch).
        self.greedy = SamplingParams(max_new_tokens=longest, greedy=True, logprobs=False)
        self.sampled = SamplingParams(temperature=cfg.temperature, max_new_tokens=longest, logprobs=False)
        self.heldout = [load_heldout(t, cfg.max_tasks) for t in cfg.tasksets]

    def evaluate(self, version: int) -> list[EvalResult]:
        return [self._taskset(h, version) for h in self.heldout]

    def _taskset(self, heldout: HeldOut, version: int) -> EvalResult:
        passes = int(self.cfg.greedy) + int(bool(self.cfg.samples))  # the greedy run, the sampled one
        with progress(f"eval v{version} {heldout.name}", total=passes * len(heldout.tasks), unit="prompts") as bar:
            return self._scored_taskset(heldout, version, bar)

    def _scored_taskset(self, heldout: HeldOut, version: int, bar: Bar) -> EvalResult:
        started = time.perf_counter()
        prompts = [prompt_tokens(t, self.ctx)[1] for t in heldout.tasks]
        rewards: list[float] = []
        lengths: list[int] = []
        accuracy = None
        if self.cfg.greedy:
            scored = self._score(heldout.tasks, prompts, 1, self.greedy, bar)
            accuracy = sum(self._correct(r[0]) for r, _ in scored) / len(scored)
            rewards, lengths = [r[0] for r, _ in scored], [n[0] for _, n in scored]
        pass_at: dict[str, float] = {}
        n = self.cfg.samples
        if n:
            scored = self._score(heldout.tasks, prompts, n, self.sampled, bar)
            for k in ks_for(n):
                pass_at[f"pass@{k}"] = sum(pass_at_k(n, sum(map(self._correct, r)), k) for r, _ in scored) / len(scored)
            rewards = [x for r, _ in scored for x in r]  # the samples' rewards, not the greedy ones
            lengths = [x for _, ls in scored for x in ls]
        return EvalResult(model=self.model, version=version, taskset=heldout.name, tasks=len(heldout.tasks),
                          greedy_accuracy=accuracy, samples=n, pass_at=pass_at,
                          mean_reward=sum(rewards) / len(rewards), mean_response_tokens=sum(lengths) / len(lengths),
                          seconds=time.perf_counter() - started)

    def _score(self, tasks: list[Task], prompts: list[list[int]], n: int,
               params: SamplingParams, bar: Bar) -> list[tuple[list[float], list[int]]]:
        """Per task: the rewards and lengths of its `n` answers."""
        out = []
        for start in range(0, len(tasks), BATCH_PROMPTS):
            batch = self.engine.generate(prompts[start:start + BATCH_PROMPTS], n, params)
            for task, samples in zip(tasks[start:start + BATCH_PROMPTS], batch):
                out.append(([total(self.reward(s.text, task)) for s in samples], [len(s.tokens) for s in samples]))
            bar.advance(len(batch))
        return out

    def _correct(self, reward: float) -> bool:
        return reward >= self.cfg.success_threshold


def wrong_when_unscored(reward: RewardFn) -> RewardFn:
    """An answer whose reward gave no verdict (a timeout, a judge's unparsable reply) scores 0: it
    counts as wrong, logged, and the evaluation goes on instead of hanging or dying on it."""
    def scored(response: str, task: Task) -> dict[str, float]:
        try:
            return reward(response, task)
        except NoVerdict as e:
            log.warning("eval: task %s scored 0: %s (%s)", task.task_id, e.reason, e)
            return {}
    return scored


def metric_values(results: list[EvalResult]) -> dict[str, float]:
    """The results as one metric event's values: `<taskset>/greedy_accuracy`, `<taskset>/pass@4`, …"""
    values: dict[str, float] = {}
    for r in results:
        if r.greedy_accuracy is not None:
            values[f"{r.taskset}/greedy_accuracy"] = r.greedy_accuracy
        values.update({f"{r.taskset}/{k}": v for k, v in r.pass_at.items()})
        values[f"{r.taskset}/mean_reward"] = r.mean_reward
        values[f"{r.taskset}/mean_response_tokens"] = r.mean_response_tokens
    return values
