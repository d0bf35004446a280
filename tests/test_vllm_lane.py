"""The vLLM engine's tests (tests/vllm) need vllm, which only the rollout environment has: one test here
runs them there, so that `pytest -n 3` is the whole suite and the vLLM lane shares the cores with the
others instead of running after them (their three minutes alone were an eighth of the suite's time).
Here, at the top of tests/, it starts after the long end-to-end tests: started with them (tests/e2e,
ci19) it shared the cores with the demo's run, took 459 s instead of 313 s, and the suite ended later."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from undertow.infra.run.rollout_env import vllm_python

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.timeout(1500)  # thirty tests of up to a minute each on a loaded machine; pytest's own 600 s is per test
def test_the_vllm_engines_tests_pass_in_the_rollout_environment(tmp_path):
    # The xdist worker's variables would make the inner session think it is a worker; the broker's
    # address ($UNDERTOW_BOOTSTRAP) passes on, so the inner tests use the session's broker.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    command = [str(vllm_python()), "-m", "pytest", "tests/vllm", "-p", "no:cacheprovider",
               "--basetemp", str(tmp_path / "tmp")]
    log = tmp_path / "vllm-lane.log"
    with open(log, "w") as out:
        try:
            code: int | str = subprocess.call(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                              timeout=1400)
        except subprocess.TimeoutExpired:  # killed before the test's own limit: the failure shows its output
            code = "killed after 1400 s"
    text = log.read_text()
    # 5: nothing collected (vllm not importable there): a lane that ran nothing has not passed.
    assert code == 0, f"the vLLM lane ended: {code}; the end of its output ({log}):\n{text[-6000:]}"
    assert " passed" in text.splitlines()[-1], text[-2000:]
