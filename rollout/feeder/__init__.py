"""The task feeder: tasksets (files, HF datasets directories, procedural generators) mixed into the tasks topic."""

from undertow.rollout.feeder.items import TaskItem, load_items, source, sources
from undertow.rollout.feeder import files as _files  # noqa: F401  (fills the source registry)
from undertow.rollout.feeder import procedural as _procedural  # noqa: F401
from undertow.rollout.feeder.sampler import TaskSampler, item_key
from undertow.rollout.feeder.selectors import difficulty_weight, selectors

__all__ = ["TaskItem", "TaskSampler", "difficulty_weight", "item_key", "load_items", "selectors", "source", "sources"]
