"""`reshape`: per assembled group, shape rewards, drop zero-variance groups, compute advantages."""

from __future__ import annotations

import inspect
from typing import Any, Mapping

import numpy as np

from undertow.schemas import Experience
from undertow.schemas.base import FLOAT32_MAX
from undertow.processors.advantages import ADVANTAGES
from undertow.processors.deadline import built_in
from undertow.processors.api import Reject, processor
from undertow.processors.shaping import SHAPERS

Entry = str | Mapping[str, Any]


@processor("reshape")
class Reshape:
    """advantage: an estimator (grpo, dr_grpo, rloo, opo, reinforce, pass_k, remax, …, or a dotted path);
    shaping: shapers in order (overlong, length_penalty, clip, scale, …);
    dynamic_sampling: DAPO's filter (Yu et al. 2025, §3.2): a group whose raw rewards are all
    equal carries no learning signal under a group-relative estimator, so it is rejected."""

    def __init__(self, *, advantage: Entry = "grpo", shaping: list[Entry] = (), dynamic_sampling: bool = False,
                 min_group_size: int = 1):
        self.estimator = ADVANTAGES.resolve(advantage).bind()  # a class: one stateful instance per stage
        self.takes_lengths, self.takes_baselines = (name in _declared(self.estimator) for name in ("lengths", "baselines"))
        self.shapers = [SHAPERS.resolve(e).bind() for e in shaping]
        self.dynamic_sampling, self.min_group_size = dynamic_sampling, min_group_size
        self.bounded = built_in(self.estimator, *self.shapers)  # no user code: no stage deadline (pipeline.py)

    @staticmethod
    def reads_baselines(*, advantage: Entry = "grpo", **_: Any) -> bool:
        """Whether `advantage` needs each task's greedy-answer reward (the config's rules ask)."""
        return "baselines" in _declared(ADVANTAGES.resolve(advantage).bind())

    def process_group(self, group: list[Experience]) -> list[Experience] | Reject:
        unscored = [e.experience_id for e in group if e.reward is None]
        if unscored:
            return Reject("unscored", f"no reward on {unscored[:5]}: add a score stage before reshape")
        if len(group) < self.min_group_size:
            return Reject("small_group", f"{len(group)} samples < min_group_size {self.min_group_size}")
        raw = np.array([e.reward for e in group], dtype=np.float64)  # [G]
        if self.dynamic_sampling and len(group) > 1 and np.all(raw == raw[0]):
            return Reject("zero_variance", f"all {len(group)} rewards equal {raw[0]:g}")
        lengths = np.array([len(e.response_tokens) for e in group], dtype=np.float64)  # [G]
        shaped = raw
        for shape in self.shapers:
            shaped = shape(shaped, lengths)
        inputs = {"lengths": lengths} if self.takes_lengths else {}
        if self.takes_baselines:
            missing = [e.experience_id for e in group if not isinstance(e.metadata.get("baseline_reward"), (int, float))]
            if missing:
                return Reject("no_baseline", f"no baseline_reward on {missing[:5]}: the estimator needs the greedy "
                                             "answer's reward (rollout.greedy_baseline: true)")
            inputs["baselines"] = np.array([e.metadata["baseline_reward"] for e in group], dtype=np.float64)  # [G]
        adv = self.estimator(shaped, **inputs)  # [G]
        # Records carry float32: a finite float64 beyond its range would arrive as inf and poison a batch.
        if not (np.all(np.abs(shaped) <= FLOAT32_MAX) and np.all(np.abs(adv) <= FLOAT32_MAX)):
            return Reject("non_finite", f"rewards {shaped.tolist()[:8]} give advantages {adv.tolist()[:8]} "
                                        "outside the float32 range")
        return [_with(e, float(r), float(a)) for e, r, a in zip(group, shaped, adv)]


def _declared(estimator: Any) -> Any:
    """The inputs an estimator asks for by name (beyond the rewards)."""
    return inspect.signature(estimator).parameters


def _with(exp: Experience, reward: float, adv: float) -> Experience:
    update: dict[str, Any] = {"reward": reward, "advantages": [adv] * len(exp.response_tokens)}
    if reward != exp.reward:  # keep what shaping changed visible to whoever inspects the record
        update["reward_components"] = {**exp.reward_components, "shaping": reward - exp.reward}
    return exp.model_copy(update=update)
