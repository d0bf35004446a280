"""Under pytest-xdist, the controller's choice of the next test for a free worker (tests/turns.py says why)."""

from __future__ import annotations

import json

import pytest
from xdist.scheduler import LoadScheduling

from tests.turns import DEMO_MADE, TURNS, shared_dir


class TurnScheduling(LoadScheduling):
    """xdist's load scheduling (a worker holds the test it runs and one more), choosing which test to send."""

    def __init__(self, config: pytest.Config, log=None):
        super().__init__(config, log)
        self.shared = shared_dir(config)
        self.table: dict[str, list] | None = None
        self.demo_made = False  # once made it stays made: no more looking for its file

    def _send_tests(self, node, num: int) -> None:
        chosen = []
        for _ in range(num):
            index = self._next_for(self.node2pending[node] + chosen)
            if index is None:
                break
            self.pending.remove(index)
            chosen.append(index)
        if chosen:
            self.node2pending[node].extend(chosen)
            node.send_runtest_some(chosen)

    def _next_for(self, held: list[int]) -> int | None:
        """The first pending test that can start now; behind the demo's maker, the first quick one."""
        if not self.pending:
            return None
        if self.table is None:
            path = self.shared / TURNS
            self.table = json.loads(path.read_text()) if path.exists() else {}
        self.demo_made = self.demo_made or (self.shared / DEMO_MADE).exists()
        turn_of = lambda index: self.table.get(self.collection[index], [3, False])
        if any(turn_of(i)[0] == 0 for i in held):  # a quick test that needs no demo, behind its maker
            found = next((i for i in self.pending if turn_of(i) == [3, False]), None)
            if found is not None:
                return found
        # The maker makes the demo's run; its readers wait until it is made.
        startable = (i for i in self.pending if self.demo_made or not turn_of(i)[1] or turn_of(i)[0] == 0)
        return next(startable, self.pending[0])  # only readers left: they wait for it on its lock
