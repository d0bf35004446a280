"""The run's supervisor: children in their own process group, pid files, restart after a crash."""

from __future__ import annotations

import os
import signal
import sys
import time

from undertow.infra.run.runner import idle_for
from undertow.infra.run.supervisor import Supervisor
from tests.helpers import wait_for


def test_a_killed_child_is_restarted_with_its_arguments(tmp_path):
    sup = Supervisor(tmp_path)
    starts = tmp_path / "starts"
    script = f"open({str(starts)!r}, 'a').write('x'); import time; time.sleep(60)"
    child = sup.start("worker", [sys.executable, "-c", script])
    first = int((tmp_path / "worker.pid").read_text())
    assert first == child.proc.pid
    wait_for(starts.exists, what="the child started")
    os.killpg(first, signal.SIGKILL)  # its whole process group, as a crashed machine would
    wait_for(lambda: child.returncode is not None, what="the killed child reaped")
    assert child.returncode == -signal.SIGKILL and sup.exited() == [child]

    sup.restart(child)
    second = int((tmp_path / "worker.pid").read_text())
    assert second != first and child.returncode is None and child.restarts == 1
    assert "worker exited with code -9; restart 1" in child.log.read_text()
    wait_for(lambda: starts.read_text() == "xx", what="the same command ran again")
    sup.stop()
    assert sup.exited() == [child]


def test_a_restart_waiting_out_its_backoff_does_not_hold_up_the_others(tmp_path):
    sup = Supervisor(tmp_path)
    slow = sup.start("slow", [sys.executable, "-c", "raise SystemExit(3)"])
    fast = sup.start("fast", [sys.executable, "-c", "raise SystemExit(4)"])
    wait_for(lambda: len(sup.exited()) == 2, what="both children exited")
    sup.schedule_restart(slow, 30.0)
    assert sup.exited() == [fast] and slow.waiting  # waiting is neither running nor gone for good
    sup.schedule_restart(fast, 0.0)
    assert sup.restart_due() == [fast] and not fast.waiting
    assert slow.waiting and slow.returncode == 3  # still waiting: not relaunched early
    sup.stop()
    assert not slow.waiting


def test_a_child_given_longer_to_stop_finishes_its_shutdown_work(tmp_path):
    """The evaluator scores the last weights after SIGTERM: its own timeout, not the others' 60 s."""
    sup = Supervisor(tmp_path)
    done = tmp_path / "done"
    script = (f"import signal, sys, time\ndef bye(*_):\n    time.sleep(1.5); open({str(done)!r}, 'w').write('x'); sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, bye)\nopen(sys.argv[1], 'w').write('up')\ntime.sleep(60)")
    slow = sup.start("eval", [sys.executable, "-c", script, str(tmp_path / "up-eval")])
    hasty = sup.start("other", [sys.executable, "-c", script, str(tmp_path / "up-other")])
    wait_for(lambda: (tmp_path / "up-eval").exists() and (tmp_path / "up-other").exists(), what="both children up")
    sup.stop(["other", "eval"], timeout=0.3, timeouts={"eval": 30.0})
    assert hasty.returncode == -signal.SIGKILL  # killed after 0.3 s, mid-shutdown
    assert slow.returncode == 0 and done.read_text() == "x"


def test_a_stopped_child_shuts_down_before_its_helpers_and_none_outlive_it(tmp_path):
    """A rollout worker's vLLM engine runs in processes of its own: the SIGTERM goes to the worker
    alone, which finishes with its helper still there; a helper it leaves behind is killed with it."""
    sup = Supervisor(tmp_path)
    seen, helper_pid = tmp_path / "seen", tmp_path / "helper.pid"
    script = ("import signal, subprocess, sys, time\n"
              "helper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
              f"open({str(helper_pid)!r}, 'w').write(str(helper.pid))\n"
              "def bye(*_):\n"
              "    time.sleep(0.5)  # the batch under way, on the helper\n"
              f"    open({str(seen)!r}, 'w').write('alive' if helper.poll() is None else 'gone')\n"
              "    sys.exit(0)  # without stopping the helper\n"
              "signal.signal(signal.SIGTERM, bye)\ntime.sleep(120)")
    child = sup.start("rollout", [sys.executable, "-c", script])
    wait_for(lambda: helper_pid.exists() and helper_pid.read_text(), what="the helper started")
    pid = int(helper_pid.read_text())
    sup.stop(timeout=30)
    assert child.returncode == 0 and seen.read_text() == "alive"
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z",
             timeout=10, what="the helper killed")


def test_a_pinned_child_and_the_processes_it_starts_run_on_its_cpus(tmp_path):
    """run.cpus: the affinity is set before exec, so a grandchild (torchrun's ranks, vLLM's engine) inherits it."""
    usable = sorted(os.sched_getaffinity(0))
    sup = Supervisor(tmp_path, cpus={"trainer": str(usable[-1])})
    show = "import os; print(sorted(os.sched_getaffinity(0)), flush=True)"
    script = f"import subprocess, sys; {show}; subprocess.run([sys.executable, '-c', {show!r}])"
    pinned, free = sup.start("trainer@shadow", [sys.executable, "-c", script]), sup.start("feeder", [sys.executable, "-c", show])
    wait_for(lambda: pinned.returncode is not None and free.returncode is not None, what="both children done")
    assert pinned.log.read_text().split("\n")[:2] == [str([usable[-1]])] * 2
    assert free.log.read_text().strip() == str(usable)


def test_a_finished_taskset_is_not_idle_while_a_worker_waits_to_restart(tmp_path):
    """A rollout worker that crashed (after a broker's outage) still has tasks to do: the trainer's silence
    meanwhile must not end the stage (it ended a soak with 10 tasks never generated)."""
    sup = Supervisor(tmp_path)
    feeder = sup.start("feeder", [sys.executable, "-c", "pass"])
    rollout = sup.start("rollout", [sys.executable, "-c", "raise SystemExit(1)"])
    wait_for(lambda: len(sup.exited()) == 2, what="both children exited")
    long_ago = time.time() - 100
    feeder.started = rollout.started = long_ago
    assert idle_for(sup, feeder, long_ago, settled_since=long_ago) >= 100  # nothing running, nothing to wait for
    assert idle_for(sup, feeder, long_ago, settled_since=None) == 0.0  # a worker's lag is not 0: work is left
    assert idle_for(sup, feeder, long_ago, settled_since=time.time() - 3) < 5  # idle counts from the drain
    sup.schedule_restart(rollout, 30.0)
    assert idle_for(sup, feeder, long_ago, settled_since=long_ago) == 0.0  # it comes back with work to do
    sup.restart(rollout)
    assert idle_for(sup, feeder, long_ago, settled_since=long_ago) < 5  # idle counts from its restart
    sup.stop()


def test_a_child_that_exits_has_its_group_killed_then_and_is_never_signalled_after(tmp_path, monkeypatch):
    """Its helper is killed when its exit is noticed, before it is reaped; after that its pid may be
    another process's, and its group id another's group (a broker of another test was killed by a
    late killpg), so neither a restart nor the stop signals it again."""
    sup = Supervisor(tmp_path)
    helper_pid = tmp_path / "helper.pid"
    script = ("import subprocess, sys\n"
              "helper = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'])\n"
              f"open({str(helper_pid)!r}, 'w').write(str(helper.pid))\n")
    feeder = sup.start("feeder", [sys.executable, "-c", script])
    crashed = sup.start("rollout", [sys.executable, "-c", "raise SystemExit(1)"])
    wait_for(lambda: feeder.returncode is not None and crashed.returncode is not None, what="both children exited")
    pid = int(helper_pid.read_text())
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z",
             timeout=10, what="the helper killed with the feeder's group")

    signalled = []
    monkeypatch.setattr(os, "killpg", lambda *a: signalled.append(a))
    monkeypatch.setattr(os, "kill", lambda *a: signalled.append(a))
    sup.schedule_restart(crashed, 30.0)
    sup.stop()
    assert signalled == []


def test_a_child_gets_its_own_login_and_none_gets_a_hidden_variable(tmp_path, monkeypatch):
    """`undertow run` with access.per_component: the operator's secret stays in the supervisor; each
    child has its own login, after a restart too."""
    monkeypatch.setenv("OPERATOR_SECRET", "s3cret")
    sup = Supervisor(tmp_path, env={"SHARED": "yes"}, hidden={"OPERATOR_SECRET"})
    script = ("import os, sys; open(sys.argv[1], 'a').write(repr((os.environ.get('OPERATOR_SECRET'), "
              "os.environ.get('SHARED'), os.environ.get('LOGIN'))) + '\\n')")
    seen = {name: tmp_path / f"{name}.seen" for name in ("a", "b")}
    children = [sup.start(name, [sys.executable, "-c", script, str(seen[name])], env={"LOGIN": name}) for name in seen]
    wait_for(lambda: all(c.returncode is not None for c in children), what="both children exited")
    sup.restart(children[0])
    wait_for(lambda: len(seen["a"].read_text().splitlines()) == 2, what="the restarted child ran again")
    assert seen["a"].read_text() == "(None, 'yes', 'a')\n" * 2 and seen["b"].read_text() == "(None, 'yes', 'b')\n"
    sup.stop()
