"""Each built-in watcher, in the harness: its alert fires on a stream built to trigger it, once, with
the hand-worked statistic and threshold, and stays quiet on a normal stream."""

from __future__ import annotations

import pytest

from undertow.schemas import EvalResult, MetricEvent, Rejected
from tests.helpers import exp
from undertow.watchers import Harness

T0 = 1_800_000_000.0


def responses(lengths: list[int], **kw) -> list:
    return [exp(f"g{i}", tokens=n, **kw) for i, n in enumerate(lengths)]


def trainer(step: int, **values: float) -> MetricEvent:
    return MetricEvent(component="trainer", step=step, time=T0 + step, values=values)


def evaluated(version: int, accuracy: float, taskset: str = "sums") -> EvalResult:
    return EvalResult(model="m", version=version, taskset=taskset, tasks=100, greedy_accuracy=accuracy,
                      mean_reward=accuracy, mean_response_tokens=3.0, seconds=1.0, time=T0 + version)


def rejected(reason: str) -> Rejected:
    return Rejected.of("trainer", reason, b"x")


# -- response length ---------------------------------------------------------------------------

def test_response_length_fires_once_when_the_window_mean_passes_factor_times_the_baseline():
    h = Harness({"name": "response_length", "window": 4, "baseline": 4, "factor": 2.0})
    assert h.feed(responses([10, 10, 10, 10])) == []      # the baseline: mean 10, threshold 20
    assert h.feed(responses([30, 30])) == []              # window [10, 10, 30, 30]: mean 20, not above
    (alert,) = h.feed(responses([30]))                    # [10, 30, 30, 30]: mean 25
    assert (alert.alert, alert.statistic, alert.value, alert.threshold) == ("response_length_blowup",
                                                                            "response_tokens_mean", 25.0, 20.0)
    assert h.feed(responses([30, 40])) == []              # still blown up: one alert, not one per record
    event = h.events[0]
    assert event.component == "watcher" and event.labels == {"watcher": "response_length",
                                                              "alert": "response_length_blowup"}
    assert event.values["response_tokens_mean"] == 25.0 and event.values["threshold"] == 20.0


def test_response_length_stays_quiet_on_lengths_that_vary_around_the_baseline():
    h = Harness({"name": "response_length", "window": 4, "baseline": 4})
    assert h.feed(responses([8, 12, 10, 10] * 20 + [18, 6, 15, 9] * 20)) == []


# -- format violations -------------------------------------------------------------------------

def test_format_violations_counts_truncated_responses_and_a_zero_reward_component():
    h = Harness({"name": "format_violations", "window": 4, "max_fraction": 0.5, "component": "format"})
    ok = exp(reward_components={"format": 0.1})
    cut = exp(finish="length", reward_components={"format": 0.1})
    unformatted = exp(reward_components={"format": 0.0})
    assert h.feed([ok, cut, ok, unformatted]) == []       # 2 of 4: 0.5, not above
    (alert,) = h.feed([cut])                              # [cut, ok, unformatted, cut]: 0.75
    assert (alert.statistic, alert.value, alert.threshold) == ("violation_fraction", 0.75, 0.5)
    assert alert.labels == {"component": "format"}


def test_format_violations_stays_quiet_on_well_formed_and_unscored_responses():
    h = Harness({"name": "format_violations", "window": 4, "component": "format"})
    well_formed = [exp(reward_components={"format": 0.1}), exp(), exp(finish="length"), exp()]  # 1 in 4 cut
    assert h.feed(well_formed * 30) == []


# -- entropy collapse --------------------------------------------------------------------------

def test_entropy_collapse_fires_when_the_recent_entropy_falls_below_a_fraction_of_the_start():
    h = Harness({"name": "entropy_collapse", "window": 2, "baseline": 2, "min_fraction": 0.2})
    start = [trainer(1, entropy=2.0), trainer(2, entropy=2.0)]               # baseline 2.0: threshold 0.4
    others = [MetricEvent(component="rollout-0", time=T0, values={"entropy": 0.0})]  # not the trainer's
    assert h.feed(start + others + [trainer(3, entropy=0.5), trainer(4, entropy=0.4)]) == []  # 0.45
    (alert,) = h.feed([trainer(5, entropy=0.3)])                              # (0.4 + 0.3) / 2 = 0.35
    assert (alert.statistic, alert.threshold) == ("entropy_mean", 0.4) and alert.value == pytest.approx(0.35)
    assert h.events[0].step == 5


def test_entropy_collapse_stays_quiet_while_entropy_falls_slowly():
    h = Harness({"name": "entropy_collapse"})
    assert h.feed([trainer(s, entropy=2.0 - 0.01 * s) for s in range(100)]) == []  # ends at 1.0 of 2.0


# -- reward hacking ----------------------------------------------------------------------------

def test_reward_hacking_fires_when_reward_rises_while_held_out_accuracy_falls():
    h = Harness({"name": "reward_hacking", "window": 2, "min_accuracy_drop": 0.05, "min_reward_rise": 0.05})
    h.feed([trainer(1, reward_mean=0.4), trainer(2, reward_mean=0.4), evaluated(2, 0.6)])  # best 0.6 at 0.4
    assert h.feed([trainer(3, reward_mean=0.6), trainer(4, reward_mean=0.6), evaluated(4, 0.58)]) == []  # -0.02
    (alert,) = h.feed([trainer(5, reward_mean=0.8), trainer(6, reward_mean=0.8), evaluated(6, 0.5)])
    assert (alert.statistic, alert.threshold, alert.labels) == ("accuracy_drop", 0.05, {"taskset": "sums"})
    assert alert.value == pytest.approx(0.1) and alert.details["reward_rise"] == pytest.approx(0.4)


def test_reward_hacking_stays_quiet_when_accuracy_falls_with_the_reward_or_rises_with_it():
    h = Harness({"name": "reward_hacking", "window": 2})
    rising = [r for v in range(1, 10) for r in (trainer(v, reward_mean=0.1 * v), evaluated(v, 0.1 * v))]
    falling_together = [trainer(10, reward_mean=0.2), trainer(11, reward_mean=0.2), evaluated(11, 0.3)]
    assert h.feed(rising + falling_together) == []


# -- rejections and staleness ------------------------------------------------------------------

def test_rejection_rate_fires_on_a_spike_of_rejections_per_raw_experience():
    h = Harness({"name": "rejection_rate", "window": 10, "max_rate": 0.3})
    assert h.feed(responses([3] * 9) + [rejected("truncated")]) == []  # 1 rejected per 9 experiences
    assert h.feed([rejected("invalid")]) == []                          # 2 per 8: 0.25
    (alert,) = h.feed([rejected("invalid")])                            # 3 per 7
    assert (alert.alert, alert.statistic, alert.threshold) == ("rejection_spike", "rejected_per_experience", 0.3)
    assert alert.value == pytest.approx(3 / 7) and alert.details == {"rejected": 3.0}


def test_stale_fraction_counts_only_stale_rejections():
    h = Harness({"name": "stale_fraction", "window": 8, "max_rate": 0.3})
    assert h.feed(responses([3] * 6) + [rejected("duplicate")] * 20) == []  # other reasons are not counted
    (alert,) = h.feed([rejected("stale")] * 2)                              # 6 ready, 2 stale: 0.33
    assert (alert.alert, alert.value, alert.threshold) == ("stale_spike", pytest.approx(2 / 6), 0.3)


def test_rejection_watchers_stay_quiet_on_a_normal_trickle():
    for name in ("rejection_rate", "stale_fraction"):
        h = Harness({"name": name, "window": 50})
        assert h.feed((responses([3] * 19) + [rejected("stale")]) * 20) == [], name  # 1 in 20


def test_alerts_plot_as_one_series_per_watcher():
    from undertow.infra.monitor.component import scalars_of

    h = Harness({"name": "format_violations", "window": 1, "max_fraction": 0.0})
    h.feed([exp(finish="length")])
    tags = {s.tag for s in scalars_of(h.events[0], step=0)}
    assert tags == {"watcher/format_violations/violation_fraction", "watcher/format_violations/threshold"}
