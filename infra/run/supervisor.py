"""Run the stages of a run as child processes: one log per process, clean stop, loud failure.

A crashed child is restarted after a delay (`schedule_restart`) without blocking the watch of the
others: the supervisor only notes when it is due, and `restart_due` relaunches it then.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

# Every component `undertow run` starts, in the order a stage stops them (runner.STOP_ORDER says why).
ROLES = ("feeder", "rollout", "trainer", "eval", "watch", "processors", "archive", "monitor")


def role(child_name: str) -> str:
    """`trainer` for the run's trainer and every shadow's (`trainer@gspo`)."""
    return child_name.split("@")[0]


def cpu_list(spec: str) -> set[int]:
    """CPUs of a taskset-style list: "0", "0-3", "0,2-3"."""
    cpus: set[int] = set()
    for part in str(spec).split(","):
        first, _, last = part.strip().partition("-")
        if not first.isdigit() or (last and not last.isdigit()) or int(last or first) < int(first):
            raise ValueError(f"{spec!r} is not a CPU list like \"0\", \"0-3\" or \"0,2-3\"")
        cpus.update(range(int(first), int(last or first) + 1))
    return cpus


@dataclass
class Child:
    """One supervised process."""

    name: str
    argv: list[str]
    log: Path
    proc: subprocess.Popen | None = None
    started: float = field(default_factory=time.time)
    restarts: int = 0
    restart_at: float | None = None  # crashed, waiting out its backoff until then (time.time())
    env: dict[str, str] = field(default_factory=dict)  # its own, over the supervisor's (a login)

    @property
    def returncode(self) -> int | None:
        """None while it runs. Once it has exited, what it left in its process group is killed and
        then it is reaped, in that order (see `end_group`)."""
        if self.proc is None:
            return None
        if self.proc.returncode is None and exited(self.proc):
            end_group(self.proc)
        return self.proc.returncode

    @property
    def waiting(self) -> bool:
        """Crashed and due to be restarted: neither running nor gone for good."""
        return self.restart_at is not None

    def tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class Supervisor:
    """Starts children with their own process group, watches them, stops them in order."""

    def __init__(self, log_dir: Path, env: dict[str, str] | None = None, cpus: dict[str, str] | None = None,
                 hidden: Iterable[str] = ()):
        """`env` over this process's environment, less the variables `hidden` (the operator's secrets)."""
        self.log_dir = log_dir
        self.cpus = {name: cpu_list(spec) for name, spec in (cpus or {}).items()}
        hidden = set(hidden)
        inherited = {k: v for k, v in os.environ.items() if k not in hidden}
        self.env = {**inherited, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", **(env or {})}
        self.children: list[Child] = []

    def start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Child:
        """Launch `argv` (with `env` over the supervisor's); stdout and stderr go to <log_dir>/<name>.log,
        its pid to <name>.pid."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        child = Child(name, argv, self.log_dir / f"{name}.log", env=dict(env or {}))
        self._launch(child)
        self.children.append(child)
        return child

    def restart(self, child: Child) -> None:
        """Launch a crashed child again now, with the same arguments (it resumes from what it committed)."""
        self.schedule_restart(child, 0.0)
        self.restart_due()

    def schedule_restart(self, child: Child, delay_s: float) -> None:
        """Relaunch a crashed child once `delay_s` has passed (see `restart_due`); what the crashed
        process left in its group is killed now, so nothing of it holds a port or a lock meanwhile."""
        child.restarts += 1
        child.restart_at = time.time() + delay_s
        end_group(child.proc)
        with open(child.log, "a") as out:
            out.write(f"\n=== undertow: {child.name} exited with code {child.returncode}; "
                      f"restart {child.restarts} in {delay_s:g} s ===\n")

    def restart_due(self) -> list[Child]:
        """Relaunch the children whose backoff has passed; returns them."""
        due = [c for c in self.children if c.restart_at is not None and c.restart_at <= time.time()]
        for child in due:
            child.restart_at = None
            self._launch(child)
        return due

    def _launch(self, child: Child) -> None:
        cpus = self.cpus.get(role(child.name))
        # Pinned before exec, so that every process the child starts (torchrun's ranks, vLLM's) inherits it.
        pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
        with open(child.log, "ab") as out:
            # Own process group: a Ctrl-C in the terminal reaches the supervisor only, which then
            # stops the children in an order that lets the trainer checkpoint first.
            child.proc = subprocess.Popen(child.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                          env={**self.env, **child.env}, start_new_session=True, preexec_fn=pin)
        child.started = time.time()
        (self.log_dir / f"{child.name}.pid").write_text(f"{child.proc.pid}\n")

    def exited(self) -> list[Child]:
        """Children that are no longer running and not waiting to be restarted."""
        return [c for c in self.children if c.returncode is not None and not c.waiting]

    def stop(self, names: list[str] | None = None, timeout: float = 60.0,
             timeouts: dict[str, float] | None = None) -> None:
        """SIGTERM the named children (all by default) in the given order, each waited for in turn
        (`timeouts[name]`, else `timeout` seconds) before it is killed, and what it leaves in its
        process group with it.

        The child alone gets the SIGTERM, not its group: a rollout worker finishes its batch on its
        vLLM engine's processes, which a group-wide SIGTERM killed under it mid-generation."""
        chosen = [c for n in names for c in self.children if c.name == n] if names else list(self.children)
        for child in chosen:
            child.restart_at = None  # a stop wins over a pending restart
            if child.proc is None or child.proc.returncode is not None:
                continue  # reaped already, its group killed then
            if not exited(child.proc):
                os.kill(child.proc.pid, signal.SIGTERM)  # not Popen.send_signal: it would reap
                deadline = time.monotonic() + (timeouts or {}).get(child.name, timeout)
                while not exited(child.proc) and time.monotonic() < deadline:
                    time.sleep(0.05)
            end_group(child.proc)  # the child if it overran, and anything of its group that outlived it


def exited(proc: subprocess.Popen) -> bool:
    """Whether the process has exited, leaving it unreaped: until it is reaped its pid, which is
    also its process group's id, cannot be handed to another process."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # reaped by someone else
        return True


def end_group(proc: subprocess.Popen) -> None:
    """SIGKILL the process group of a child still unreaped (running or exited), then reap it.

    Never after reaping: the kernel then recycles the pid, and a group id of that number may be
    another program's, a broker's or another run's child started in a session of its own; a
    late killpg killed those (kernel.pid_max is 32768 here, and threads use up pids as well)."""
    if proc.returncode is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)
