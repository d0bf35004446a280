"""Each estimator and shaper against numbers worked by hand."""

import numpy as np
import pytest

from undertow.processors.advantages import ADVANTAGES, ReinforceBaseline, dr_grpo, grpo, rloo
from undertow.processors.shaping import clip, length_penalty, overlong, scale

R = np.array([1.0, 0.0, 0.0, 0.0])


def test_grpo_divides_by_the_unbiased_std():
    # mean 0.25; squared deviations 0.5625 + 3 * 0.0625 = 0.75; / (4 - 1) = 0.25; std 0.5
    np.testing.assert_allclose(grpo(R, eps=0.0), [1.5, -0.5, -0.5, -0.5])


def test_dr_grpo_only_subtracts_the_mean():
    np.testing.assert_allclose(dr_grpo(R), [0.75, -0.25, -0.25, -0.25])


def test_rloo_subtracts_the_mean_of_the_others():
    # 1 - mean(0, 0, 0) = 1; 0 - mean(1, 0, 0) = -1/3
    np.testing.assert_allclose(rloo(R), [1.0, -1 / 3, -1 / 3, -1 / 3])
    np.testing.assert_allclose(rloo(np.array([2.0, 4.0])), [-2.0, 2.0])


def test_reinforce_uses_the_baseline_from_before_the_group():
    est = ReinforceBaseline(momentum=0.9)
    np.testing.assert_allclose(est(np.array([1.0, 0.0])), [1.0, 0.0])  # b = 0
    # b = 0.9 * 0 + 0.1 * 0.5 = 0.05
    np.testing.assert_allclose(est(np.array([1.0, 1.0])), [0.95, 0.95])


def test_single_sample_groups_get_zero_advantage():
    for fn in (grpo, rloo):
        assert fn(np.array([3.0])).tolist() == [0.0]


def test_estimators_are_registered_by_short_name():
    assert set(ADVANTAGES.names()) >= {"grpo", "dr_grpo", "rloo", "reinforce"}


def test_dapo_overlong_ramp():
    lengths = np.array([5.0, 6.0, 8.0, 10.0, 11.0])  # max 10, cache 4: the ramp starts after 6 tokens
    got = overlong(np.zeros(5), lengths, max_tokens=10, cache_tokens=4)
    np.testing.assert_allclose(got, [0.0, 0.0, -0.5, -1.0, -1.0])


@pytest.mark.parametrize("fn,kw,want", [
    (length_penalty, {"coef": 0.1}, [0.5, -1.0]),        # 1 - 0.1*5, 0 - 0.1*10
    (clip, {"low": -0.5, "high": 0.5}, [0.5, 0.0]),
    (scale, {"factor": 2.0, "shift": -1.0}, [1.0, -1.0]),
])
def test_shapers(fn, kw, want):
    np.testing.assert_allclose(fn(np.array([1.0, 0.0]), np.array([5.0, 10.0]), **kw), want)
