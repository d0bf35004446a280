"""Progress bars on long work (archive, replay, model conversion, evaluation), drawn by rich on stderr.

Only on a terminal: under `undertow run` a component's stderr is its log file, which should hold
lines, not a redrawn bar (rich's TTY_COMPATIBLE=1 forces one anywhere). The work itself takes a
`Bar` and calls `advance`, so it runs the same with or without one.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)


class Bar:
    """What a piece of work reports: how much there is (when it knows) and how much is done."""

    def __init__(self, progress: Progress | None = None, task: TaskID | None = None):
        self._progress, self._task = progress, task
        self.done = 0.0

    def total(self, total: float | None) -> None:
        if self._progress is not None:
            self._progress.update(self._task, total=total)

    def advance(self, n: float = 1) -> None:
        self.done += n
        if self._progress is not None:
            self._progress.advance(self._task, n)


@contextmanager
def progress(description: str, total: float | None = None, unit: str = "", console: Console | None = None) -> Iterator[Bar]:
    """A bar for `description` while the block runs; a silent one where stderr is not a terminal."""
    console = console or Console(stderr=True)
    if not console.is_terminal:
        yield Bar()
        return
    columns = [TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn(unit),
               TimeElapsedColumn(), TimeRemainingColumn()]
    with Progress(*columns, console=console) as shown:
        yield Bar(shown, shown.add_task(description, total=total))
