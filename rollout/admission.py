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
   trained. AReaL's rule (Fu et al. 2025, "AReaL", staleness-aware rollout: N_r <= (i + eta + 1) * B,
   with N_r the rollouts so far, i the trainer's version, eta the staleness bound, B the batch)
   bounds it, counted over the run and per worker: with B = `experiences_per_version` (what the
   trainer takes of this worker's experiences per version), the worker publishes at most
   (L - L0 + max_staleness + 1) * B experiences in all, L0 being the trainer version it first saw
   (a worker that joins a long run late does not get the versions before it as credit). Counted
   per version instead (a fresh (max_staleness + 1) * B at each new version, as this file did
   before), a worker faster than the trainer published up to (max_staleness + 1) times what the
   trainer takes, and the excess went stale. `experiences_per_version = None` turns this part off.

3. Stale in the queue: with that budget the worker's next experience, the (N_r + 1)-th since L0,
   is trained at version L0 + ⌊N_r / B⌋ (the trainer takes B of this worker's per version). Made
   with v, it arrives (L0 + ⌊N_r / B⌋ - v) versions stale. When that exceeds max_staleness while a
   newer version is announced (its weights still on their way), the worker waits for them instead:
   made with v it would be dropped as stale, and the trainer would then wait for a batch generated
   after it asked, every step (measured: the worker, one version behind from a batch dropped early,
   generated each batch only after the version it was trained at was announced; the trainer waited
   5.5 s of each 31 s step for it). With the new weights in, it runs a batch ahead of the trainer.

Waiting is always for the trainer: a newer announced version releases both conditions. One valve:
if the trainer announces nothing for `cap_wait_s` while a worker waits on (2), it gets another
(max_staleness + 1) * B on top (kept: the trainer ate those without moving on). The trainer may be idle exactly because it got nothing usable (processors dropped every
group, e.g. DAPO dynamic sampling on a model that always scores 0); without the valve workers and
trainer would wait for each other for ever. Staleness stays bounded: the trainer still drops stale data. A trainer that resumed from a checkpoint
(L goes down) starts the count again from there.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Admission:
    """The worker's view of the trainer's progress and its own output since it first saw the trainer."""

    max_staleness: int
    experiences_per_version: int | None = None
    cap_wait_s: float | None = None  # after this long capped on one version, the valve adds a budget
    latest: int = 0  # highest version the trainer has announced (L)
    held: int = 0  # version of the weights the worker generates with (v)
    first_seen: int | None = None  # L0: the trainer version the count starts from
    published_total: int = 0  # experiences published since `first_seen` (N_r)
    valve_extra: int = 0  # experiences the valve added to the allowance
    capped_since: float | None = None  # when the budget ran out on `latest`
    valve_opened: int = 0  # times the valve added a budget without a new version

    def trainer_announced(self, version: int) -> None:
        """The trainer's newest version; lower than before when it resumed from a checkpoint."""
        if self.first_seen is None:  # the count starts here
            self.first_seen = version
        elif version < self.latest:
            self.trainer_resumed(version)
        if version != self.latest:
            self.capped_since = None
        self.latest = version

    def trainer_resumed(self, version: int) -> None:
        """The trainer went back to a checkpoint's `version`: the count starts again from there. Counted
        on from before, it would include what the resumed trainer drops as stale (made with weights
        it replays past), and the worker would wait on the valve for experiences nobody will train."""
        self.first_seen, self.published_total, self.valve_extra = version, 0, 0
        self.latest, self.capped_since = version, None

    def weights_loaded(self, version: int) -> None:
        self.held = version
        if version > self.latest:
            self.trainer_announced(version)

    def published(self, experiences: int) -> None:
        self.published_total += experiences

    def allowance(self) -> int | None:
        """(L - L0 + max_staleness + 1) * B (+ what the valve added): N_r's bound; None: no cap."""
        if self.experiences_per_version is None:
            return None
        versions = self.latest - (self.latest if self.first_seen is None else self.first_seen)
        return (versions + self.max_staleness + 1) * self.experiences_per_version + self.valve_extra

    def room(self) -> int | None:
        """Experiences that may still be published (None: no cap). A batch of tasks is cut to it, as one
        task was admitted while anything was left: it may overshoot by one group."""
        allowance = self.allowance()
        return None if allowance is None else max(0, allowance - self.published_total)

    def queued_staleness(self) -> int | None:
        """How stale the next experience, made with the held weights, will be when the trainer reaches
        it (condition 3); None without a budget."""
        if self.experiences_per_version is None or self.first_seen is None:
            return None
        return self.first_seen + self.published_total // self.experiences_per_version - self.held

    def reason_to_wait(self, now: float = 0.0) -> str | None:
        """None when a generation may start, else why not (for logs and metrics). `now`: seconds."""
        if self.latest - self.held > self.max_staleness:
            return f"holding v{self.held}, trainer at v{self.latest}: more than {self.max_staleness} behind"
        queued = self.queued_staleness()
        if self.latest > self.held and queued is not None and queued > self.max_staleness:
            return (f"v{self.latest} announced, its weights not in yet: made with v{self.held} the next experience "
                    f"would be {queued} versions stale when trained")
        allowance = self.allowance()
        if allowance is not None and self.published_total >= allowance:
            if self.capped_since is None:
                self.capped_since = now
            if self.cap_wait_s is None or now - self.capped_since < self.cap_wait_s:
                return (f"published {self.published_total} >= {allowance} experiences by trainer v{self.latest} "
                        f"(counted from v{self.first_seen if self.first_seen is not None else 0})")
            self.valve_extra += (self.max_staleness + 1) * self.experiences_per_version
            self.capped_since = None
            self.valve_opened += 1
        return None
