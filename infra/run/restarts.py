"""The restart policy of `undertow run` as a rate: crashes counted in a sliding window, backoff between them.

Pure bookkeeping (no processes, no Kafka): `RestartBudget.crashed` says how long to wait before
restarting a component, or that it crashed too often lately and the run must fail.
"""

from __future__ import annotations

import signal
from collections import deque
from dataclasses import asdict, dataclass

from undertow.infra.run.config import RestartPolicy

LOG_LINE_CHARS = 200  # a restart record names the cause, it does not carry the log


def describe_exit(code: int) -> str:
    """`-9` -> "signal SIGKILL", `75` -> "exit code 75" (Popen reports a signal as its negative)."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


SUPERVISOR_MARK = "=== undertow:"  # the supervisor's own lines in a child's log (infra/run/supervisor.py)


def last_line(text: str) -> str:
    """The last non-blank line of a log tail the component wrote itself, shortened: what it said
    before it died (a child killed before it printed anything leaves only the supervisor's marks)."""
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith(SUPERVISOR_MARK)]
    return lines[-1][:LOG_LINE_CHARS] if lines else ""


@dataclass
class Crash:
    """One crash of one component and what the policy made of it."""

    component: str
    time: float
    exit_code: int
    cause: str
    log_line: str
    crashes_in_window: int
    backoff_s: float | None  # None: over the rate, the run fails

    def as_dict(self) -> dict:
        return asdict(self)


class RestartBudget:
    """Crash times per component within the policy's window; the backoff doubles with each one."""

    def __init__(self, policy: RestartPolicy):
        self.policy = policy
        self.recent: dict[str, deque[float]] = {}

    def crashed(self, component: str, now: float, exit_code: int, log_tail: str = "") -> Crash:
        """Count a crash at `now`; its `backoff_s` is the wait before the restart, None past the rate."""
        window = self.recent.setdefault(component, deque())
        while window and window[0] <= now - self.policy.window_s:
            window.popleft()
        window.append(now)
        count = len(window)
        backoff = None
        if count <= self.policy.max:
            backoff = min(self.policy.backoff_s * 2 ** (count - 1), self.policy.backoff_max_s)
        return Crash(component, now, exit_code, describe_exit(exit_code), last_line(log_tail), count, backoff)
