"""Watchers: side consumers of the experience, metrics and evals topics that publish alerts.

A watcher is a function or class registered with `@watcher("name", reads=(...))` (or named by dotted
path in config); see watchers/api.py for the contract, watchers/harness.py to test one without a
broker, and watchers/runner.py for how `undertow watch` runs them.
"""

from undertow.watchers.api import COMPONENT, WATCHERS, Alert, watcher
from undertow.watchers.harness import Harness
from undertow.watchers import experiences, training  # noqa: F401 — registers the built-ins

__all__ = ["COMPONENT", "WATCHERS", "Alert", "Harness", "watcher"]
