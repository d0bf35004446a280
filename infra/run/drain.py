"""Whether a stage's workers have done what they were given: the lag of the rollout group on the tasks
topic and of the processors on the raw topic, read from a thread of its own (a broker's outage must
not hold the runner's watch loop, which restarts crashed children).

A finite stage ends once both lags are 0 and the trainer has had nothing since. Idle time alone was
not enough: after a 120-s outage the rollout worker crashed on its expired group membership and the
processors were still starting again, and the trainer's 25 s of silence ended a run with 16 tasks
never generated and 136 experiences never trained (the CI soak, 2026-12-04).
"""

from __future__ import annotations

import logging
import threading
import time

from undertow.streams import KafkaSettings
from undertow.streams.consumer import GroupLag

log = logging.getLogger(__name__)


class Drain:
    """Polls the lag of each (topic, group) every `every_s` seconds once started."""

    def __init__(self, kafka: KafkaSettings, backlogs: list[tuple[str, str]], every_s: float = 2.0):
        self.kafka, self.backlogs, self.every_s = kafka, backlogs, every_s
        self.lags: dict[str, int] | None = None  # group -> records it has yet to do; None: not read
        self.settled_since: float | None = None  # since when every lag has read 0 (time.time()); None: not now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="drain", daemon=True)

    def start(self) -> "Drain":
        if not self._thread.is_alive() and not self._stop.is_set():
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _watch(self) -> None:
        readers: list[GroupLag] = []
        try:
            while not self._stop.is_set():
                try:
                    while len(readers) < len(self.backlogs):  # one at a time: a failed one leaks none made before it
                        readers.append(GroupLag(self.kafka, *self.backlogs[len(readers)]))
                    self.lags = {r.group: r() for r in readers}
                except Exception as e:  # noqa: BLE001 — unknown is "not drained"; the next reading may succeed
                    log.warning("the stage's lag could not be read (%s); trying again", e)
                    self.lags = None
                if self.lags is None or any(self.lags.values()):
                    self.settled_since = None
                elif self.settled_since is None:
                    self.settled_since = time.time()
                self._stop.wait(self.every_s)
        finally:
            for r in readers:
                r.close()
