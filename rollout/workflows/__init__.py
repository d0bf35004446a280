"""Workflows turn one task into a group of trajectories: single-turn, or multi-turn with an environment."""

from undertow.rollout.workflows.base import Trajectory, WorkflowContext, build_workflow, prompt_tokens, workflow, workflows
from undertow.rollout.workflows.batch import BatchWorkflow, Outcome, batched, build_batch_workflow
from undertow.rollout.workflows.environment import Environment, StepResult, environment, environments
from undertow.rollout.workflows import single_turn as _single  # noqa: F401  (fills the registries)
from undertow.rollout.workflows import multi_turn as _multi  # noqa: F401
from undertow.rollout.workflows import number_guess as _guess  # noqa: F401
from undertow.rollout.workflows import reference as _reference  # noqa: F401
from undertow.rollout.workflows import tool_agent as _tool_agent  # noqa: F401
from undertow.rollout import environments as _environments  # noqa: F401  (frozen_lake, ...)

__all__ = ["BatchWorkflow", "Environment", "Outcome", "StepResult", "Trajectory", "WorkflowContext", "batched",
           "build_batch_workflow", "build_workflow", "environment",
           "environments", "prompt_tokens", "workflow", "workflows"]
