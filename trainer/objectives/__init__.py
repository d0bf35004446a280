"""What one optimizer step minimises, one file per objective: RL and SFT on experiences, DPO (and its
preference losses) on pairs. Importing the package registers them; `api` holds the contract."""

from .api import ExperienceObjective, Objective, StepLoss, objectives, policy_logprobs, reference_logprobs
from . import dpo, rl, sft  # noqa: F401  (registers the built-in objectives)
from .dpo import DPOObjective
from .rl import RLObjective
from .sft import SFTObjective

__all__ = ["DPOObjective", "ExperienceObjective", "Objective", "RLObjective", "SFTObjective", "StepLoss",
           "objectives", "policy_logprobs", "reference_logprobs"]
