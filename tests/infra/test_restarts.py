"""The restart policy as a rate: crashes counted in a sliding window, backoff doubling, capped."""

from __future__ import annotations

import pytest

from undertow.kernel.config_io import ConfigError
from undertow.infra.run.restarts import RestartBudget, describe_exit, last_line
from undertow.infra.run.config import RestartPolicy, RunSection, load_run_config


def test_five_crashes_in_the_window_are_restarted_and_the_sixth_fails():
    budget = RestartBudget(RestartPolicy(max=5, window_s=600, backoff_s=1, backoff_max_s=30))
    waits = [budget.crashed("processors", t, -9).backoff_s for t in (0, 10, 20, 30, 40)]
    assert waits == [1, 2, 4, 8, 16]  # 1 s, doubling
    sixth = budget.crashed("processors", 50, -9)
    assert sixth.backoff_s is None and sixth.crashes_in_window == 6


def test_crashes_older_than_the_window_no_longer_count():
    budget = RestartBudget(RestartPolicy(max=2, window_s=100, backoff_s=1, backoff_max_s=30))
    assert budget.crashed("trainer", 0, 1).backoff_s == 1
    assert budget.crashed("trainer", 50, 1).backoff_s == 2
    # The crash at 0 left the window at 100: two in the window again, allowed, and the backoff shrinks.
    later = budget.crashed("trainer", 120, 1)
    assert later.crashes_in_window == 2 and later.backoff_s == 2
    assert budget.crashed("trainer", 1000, 1).backoff_s == 1  # a day later: as if it never crashed


def test_each_component_has_its_own_budget_and_the_backoff_is_capped():
    budget = RestartBudget(RestartPolicy(max=10, window_s=600, backoff_s=1, backoff_max_s=5))
    assert [budget.crashed("rollout", t, 1).backoff_s for t in range(5)] == [1, 2, 4, 5, 5]
    assert budget.crashed("feeder", 5, 1).backoff_s == 1


def test_a_policy_of_zero_fails_at_the_first_crash():
    assert RestartBudget(RestartPolicy(max=0)).crashed("trainer", 0, 1).backoff_s is None


def test_a_crash_names_its_cause_and_the_last_log_line():
    crash = RestartBudget(RestartPolicy()).crashed("trainer", 0, -9, "step 3\nTraceback\nValueError: bad  \n\n")
    assert crash.cause == "signal SIGKILL" and crash.log_line == "ValueError: bad"
    assert describe_exit(75) == "exit code 75" and describe_exit(-15) == "signal SIGTERM"
    assert len(last_line("x" * 1000)) == 200
    assert last_line("loading\n\n=== undertow: trainer exited with code -9; restart 1 in 1 s ===\n") == "loading"


def test_the_policy_is_typed_and_an_int_is_short_for_its_max():
    assert RunSection().restarts == RestartPolicy(max=5, window_s=600, backoff_s=1, backoff_max_s=30)
    assert RunSection(restarts=3).restarts == RestartPolicy(max=3)
    assert RunSection(restarts={"max": 2, "window_s": 60}).restarts.window_s == 60
    with pytest.raises(ValueError):
        RunSection(restarts=True)


def test_a_bad_policy_names_the_field(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("run:\n  restarts: {max: -1, windows_s: 60}\n")
    with pytest.raises(ConfigError) as e:
        load_run_config(path)
    assert "run.restarts.max" in str(e.value) and "run.restarts.windows_s" in str(e.value)
