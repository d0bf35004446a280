"""Stream processors between rollout and trainer: clean, score, reshape, prioritize, and plugins.

A plugin is a function or class registered with `@processor("name")` (or named by dotted path in
config); see processors/api.py for the contract and processors/pipeline.py for how stages run.
"""

from processors.api import PROCESSORS, Reject, Stage, build_stages, processor
from processors.groups import Arrival
from processors.harness import Harness
from processors.pipeline import Dropped, Output, Pipeline
from processors.score import reward

__all__ = ["PROCESSORS", "Arrival", "Dropped", "Harness", "Output", "Pipeline", "Reject", "Stage",
           "build_stages", "processor", "reward"]
