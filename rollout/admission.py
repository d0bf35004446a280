"""Admission control: when a worker may start the next generation (pure; the worker asks it).

What "ahead of the trainer" means here. Conventions: an experience's policy_version v is the step
count of the weights that generated it, the trainer announces version L on the weights topic after
step L, and an experience's staleness is (trainer step when it is trained) - v. The trainer drops
experiences staler than `max_staleness`, so a worker that produces them only wastes compute. That
happens in two ways, and a generation is admitted only when neither holds:

1. Old weights: the worker holds v while the trainer has already announced L with L - v >
   max_staleness (a chunk still in flight, or an update refused for a bad checksum). Everything it
   made now would be stale on arrival, so it waits for a newer verified version.
2. Over-production: with fresh weights (v = L) a worker can still queue more data than the trainer
   eats before it moves max_staleness versions on; the tail of that queue would be stale when
   trained. If the trainer takes about `experiences_per_version` of this worker's experiences per
   announced version, at most (max_staleness + 1) * experiences_per_version experiences may be
   published after the worker first sees version L; then it waits for L + 1. This is AReaL's rule
   (Fu et al. 2025, "AReaL", staleness-aware rollout: N_r <= (i + eta + 1) * B), per worker and
   counted from the latest version. `experiences_per_version = None` turns this part off.

Waiting is always for the trainer: a newer announced version releases both conditions. One valve:
if the trainer announces nothing for `cap_wait_s` while a worker waits on (2), the budget starts
again. The trainer may be idle exactly because it got nothing usable (processors dropped every
group, e.g. DAPO dynamic sampling on a model that always scores 0); without the valve workers and
trainer would wait for each other for ever. Staleness stays bounded: the trainer still drops stale data.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Admission:
    """The worker's view of the trainer's progress and its own output since."""

    max_staleness: int
    experiences_per_version: int | None = None
    cap_wait_s: float | None = None  # after this long capped on one version, the budget starts again
    latest: int = 0  # highest version the trainer has announced (L)
    held: int = 0  # version of the weights the worker generates with (v)
    published_since_latest: int = 0  # experiences published since `latest` was first seen
    capped_since: float | None = None  # when the budget ran out on `latest`
    valve_opened: int = 0  # times the budget was renewed without a new version

    def trainer_announced(self, version: int) -> None:
        """The trainer's newest version; lower than before when it resumed from a checkpoint."""
        if version != self.latest:
            self.latest = version
            self.published_since_latest, self.capped_since = 0, None

    def weights_loaded(self, version: int) -> None:
        self.held = version
        if version > self.latest:
            self.trainer_announced(version)

    def published(self, experiences: int) -> None:
        self.published_since_latest += experiences

    def room(self) -> int | None:
        """Experiences that may still be published on `latest` (None: no cap). A batch of tasks is
        cut to it, as one task was admitted while anything was left: it may overshoot by one group."""
        if self.experiences_per_version is None:
            return None
        return max(0, (self.max_staleness + 1) * self.experiences_per_version - self.published_since_latest)

    def reason_to_wait(self, now: float = 0.0) -> str | None:
        """None when a generation may start, else why not (for logs and metrics). `now`: seconds."""
        if self.latest - self.held > self.max_staleness:
            return f"holding v{self.held}, trainer at v{self.latest}: more than {self.max_staleness} behind"
        if self.experiences_per_version is not None:
            budget = (self.max_staleness + 1) * self.experiences_per_version
            if self.published_since_latest >= budget:
                if self.capped_since is None:
                    self.capped_since = now
                if self.cap_wait_s is None or now - self.capped_since < self.cap_wait_s:
                    return f"published {self.published_since_latest} >= {budget} experiences on trainer v{self.latest}"
                self.published_since_latest, self.capped_since = 0, None
                self.valve_opened += 1
        return None
