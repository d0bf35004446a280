"""torch, imported at its first use. Every process reads the run's config, whose checks import the
registries of the trainer's losses and objectives and of the rollout's engines; most processes (the
feeder, the processors, the archive, `undertow status`) never compute with torch, whose import costs
each over a second of CPU."""

from __future__ import annotations

from typing import Any, Callable


class LazyModule:
    """Stands for a module and imports it when first asked for an attribute (Python's import lock
    makes that safe from several threads). Each attribute is kept once found, so the losses' and
    the engine's hot loops look `torch.where` up as a plain attribute, not through this method."""

    def __init__(self, load: Callable[[], Any]):
        self._load = load

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._load(), attr)
        setattr(self, attr, value)
        return value


def _torch() -> Any:
    import torch

    return torch


def _functional() -> Any:
    import torch.nn.functional

    return torch.nn.functional


torch: Any = LazyModule(_torch)
functional: Any = LazyModule(_functional)
