"""benchmarks/capacity.py, the capacity model, on cases worked by hand."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.helpers import ROOT

spec = importlib.util.spec_from_file_location("capacity", ROOT / "benchmarks" / "capacity.py")
capacity = importlib.util.module_from_spec(spec)
sys.modules["capacity"] = capacity  # dataclasses resolve their annotations through it
spec.loader.exec_module(capacity)
Rates, Shape, simulate = capacity.Rates, capacity.Shape, capacity.simulate


def test_a_trainer_bound_run_trains_one_batch_per_step_and_never_waits():
    # 64 experiences per 0.4 + 0.1 s of trainer time = 128/s; 4 workers x 1,000/s supply far more
    rates = Rates(gen_per_s=1000.0, step_s=0.4, publish_s=0.1)
    p = simulate(rates, Shape(rollout_workers=4, experiences_per_version=None, max_staleness=100), steps=200, jitter=0)
    assert p.experiences_per_s == pytest.approx(128.0, rel=0.01) and p.trainer_idle == pytest.approx(0.0, abs=0.01)
    assert p.bottleneck == "trainer"


def test_a_rollout_bound_run_trains_what_the_workers_make_and_partitions_cap_the_workers():
    # 2 workers x 32/s = 64 experiences/s; a 64-experience step takes 0.05 s, so the trainer waits
    # 1 - 0.05 s / 1 s = 95% of the time. The workers' batches land together every 2 s, the steps come
    # in bursts: 101 steps put exactly 50 bursts (100 s) between the first step's end and the last's.
    rates = Rates(gen_per_s=32.0, step_s=0.05)
    two = simulate(rates, Shape(rollout_workers=2, experiences_per_version=None, max_staleness=100), steps=101, jitter=0)
    assert two.experiences_per_s == pytest.approx(64.0, rel=0.02) and two.trainer_idle == pytest.approx(0.95, abs=0.01)
    # six workers on four task partitions make what four make: 128/s
    six = simulate(rates, Shape(rollout_workers=6, tasks_partitions=4, experiences_per_version=None,
                                max_staleness=100), steps=101, jitter=0)
    assert six.experiences_per_s == pytest.approx(128.0, rel=0.02) and six.bottleneck == "rollout"


def test_a_worker_faster_than_the_trainer_keeps_only_the_staleness_lead():
    # rollout/admission.py's budget is AReaL's, counted over the run: by trainer version L a worker has
    # published at most (L + max_staleness + 1) x experiences_per_version = (L + 3) x 64. A worker far
    # faster than the trainer (1 step/s) leads it by 3 x 64 = 192 at most, which the trainer takes
    # within max_staleness versions: nothing goes stale. (Counted per announced version, as before,
    # it published 192 per version while the trainer took 64: 128 per step were dropped as stale.)
    rates = Rates(gen_per_s=10_000.0, step_s=1.0)
    p = simulate(rates, Shape(max_staleness=2, experiences_per_version=64), steps=50, jitter=0)
    assert p.experiences_per_s == pytest.approx(64.0, rel=0.01) and p.staleness_mean <= 2.0
    assert p.stale_dropped == 0
