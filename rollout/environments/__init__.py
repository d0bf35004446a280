"""Built-in environments of multi-turn workflows (the protocol and registry: workflows/environment.py)."""

from undertow.rollout.environments import frozen_lake as _frozen_lake  # noqa: F401  (fills the registry)
