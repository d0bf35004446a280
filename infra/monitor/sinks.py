"""Metric sinks: where the monitor writes each metric (TensorBoard, W&B, MLflow, a user's class).

A sink is a class registered by name and built with a SinkContext plus its own keyword arguments
from config (`monitor: {sinks: [tensorboard, {name: wandb, project: demo}]}`); a user's is named
by dotted path. The built-ins import their library when built, so a missing one is an error naming
the extra to install, not an ImportError at start-up of every command.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

from undertow.kernel.registry import Registry

EXTRA = "monitor"  # pyproject's optional-dependencies group holding the sinks' libraries


@dataclass(frozen=True)
class Scalar:
    """One value to write: `tag` is `<component>/<metric>`, `step` the policy version."""

    tag: str
    value: float
    step: int
    time: float  # when the component reported it (unix seconds)


@dataclass(frozen=True)
class SinkContext:
    """What every sink is told about the run it records: where to write and what to call it."""

    directory: Path  # the run directory: file-based sinks write below it
    run: str  # the run's name (its directory's name)
    stage: str  # one stage is one TensorBoard run, one W&B run, one MLflow run
    namespace: str


class Sink(Protocol):
    def write(self, scalars: list[Scalar]) -> None:
        """Record `scalars` (one poll's worth, in the order they were reported)."""

    def flush(self) -> None:
        """Make what was written durable: the monitor commits its offsets after this returns."""

    def close(self) -> None: ...


class MissingExtra(RuntimeError):
    """A configured sink's library is not installed."""


sinks: Registry[type] = Registry("monitor sink")


@contextmanager
def needs_extra(sink: str) -> Iterator[None]:
    """Around a sink's imports: a missing package says which extra installs it."""
    try:
        yield
    except ImportError as e:
        raise MissingExtra(f"monitor sink {sink!r} needs a package that is not installed ({e}); "
                           f"install it with: pip install 'undertow[{EXTRA}]'") from None


_UNSAFE = re.compile(r"[^A-Za-z0-9_./ -]")


def safe_tag(tag: str) -> str:
    """A tag every backend accepts (MLflow allows only letters, digits, `_ - . / ` and space)."""
    return _UNSAFE.sub("_", tag)
