"""Built-in watchers of the trainer's and the evaluator's numbers: entropy collapse, reward hacking."""

from __future__ import annotations

from undertow.schemas import EvalResult, MetricEvent
from undertow.watchers.api import Alert, watcher
from undertow.watchers.stats import Rolling, Trigger

TRAINER = "trainer"  # the trainer's metric events' component


@watcher("entropy_collapse", reads=("metrics",))
class EntropyCollapse:
    """The policy's token entropy (trainer metric `entropy`), averaged over the last `window` steps,
    below `min_fraction` of its mean over the first `baseline` steps: sampling has stopped exploring."""

    def __init__(self, *, window: int = 5, baseline: int = 5, min_fraction: float = 0.2):
        if window < 1 or baseline < 1 or not 0 < min_fraction < 1:
            raise ValueError(f"window and baseline must be >= 1, 0 < min_fraction < 1; got {window}, {baseline}, "
                             f"{min_fraction}")
        self.window, self.first, self.min_fraction = Rolling(window), Rolling(baseline), min_fraction
        self.trigger = Trigger()

    def __call__(self, event: MetricEvent) -> Alert | None:
        if event.component != TRAINER or "entropy" not in event.values:
            return None
        entropy = event.values["entropy"]
        if not self.first.full:
            self.first.add(entropy)
        self.window.add(entropy)
        if not (self.first.full and self.window.full):
            return None
        threshold = self.min_fraction * self.first.mean()
        mean = self.window.mean()
        if self.trigger(mean < threshold):
            return Alert("entropy_collapse", "entropy_mean", mean, threshold,
                         details={"baseline_entropy_mean": self.first.mean()})
        return None


@watcher("reward_hacking", reads=("metrics", "evals"))
class RewardHacking:
    """Training reward up while held-out accuracy is down: on each evaluation of a taskset, its greedy
    accuracy at least `min_accuracy_drop` below its best so far while the trainer's `reward_mean`
    (mean of the last `window` steps) is at least `min_reward_rise` above what it was at that best."""

    def __init__(self, *, window: int = 10, min_accuracy_drop: float = 0.05, min_reward_rise: float = 0.05):
        if window < 1 or min_accuracy_drop <= 0 or min_reward_rise < 0:
            raise ValueError(f"window must be >= 1, min_accuracy_drop > 0, min_reward_rise >= 0; got {window}, "
                             f"{min_accuracy_drop}, {min_reward_rise}")
        self.reward = Rolling(window)
        self.min_accuracy_drop, self.min_reward_rise = min_accuracy_drop, min_reward_rise
        self.best: dict[str, tuple[float, float]] = {}  # taskset -> (best accuracy, training reward then)
        self.triggers: dict[str, Trigger] = {}

    def __call__(self, record: MetricEvent | EvalResult) -> Alert | None:
        if isinstance(record, MetricEvent):
            if record.component == TRAINER and "reward_mean" in record.values:
                self.reward.add(record.values["reward_mean"])
            return None
        if record.greedy_accuracy is None or not self.reward.values:
            return None
        accuracy, reward, taskset = record.greedy_accuracy, self.reward.mean(), record.taskset
        best_accuracy, reward_at_best = self.best.get(taskset, (-1.0, 0.0))
        if accuracy >= best_accuracy:
            self.best[taskset] = (accuracy, reward)
            self.triggers.setdefault(taskset, Trigger())(False)
            return None
        drop, rise = best_accuracy - accuracy, reward - reward_at_best
        trigger = self.triggers.setdefault(taskset, Trigger())
        if trigger(drop >= self.min_accuracy_drop and rise >= self.min_reward_rise):
            return Alert("reward_hacking", "accuracy_drop", drop, self.min_accuracy_drop,
                         details={"reward_rise": rise, "min_reward_rise": self.min_reward_rise,
                                  "greedy_accuracy": accuracy, "best_greedy_accuracy": best_accuracy},
                         labels={"taskset": taskset})
        return None
