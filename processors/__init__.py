"""Stream processors between rollout and trainer: clean, score, reshape, prioritize, and plugins.

A plugin is a function or class registered with `@processor("name")` (or named by dotted path in
config); see processors/api.py for the contract and processors/pipeline.py for how stages run.
"""

from undertow.processors.api import PROCESSORS, Reject, Stage, build_stages, processor
from undertow.processors.groups import Arrival
from undertow.processors.harness import Harness
from undertow.processors.pipeline import Dropped, Output, Pipeline
from undertow.processors.score import stream_score

__all__ = ["PROCESSORS", "Arrival", "Dropped", "Harness", "Output", "Pipeline", "Reject", "Stage",
           "build_stages", "processor", "stream_score"]
