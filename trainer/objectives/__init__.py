"""What one optimizer step minimises, one file per objective: RL and SFT on experiences; DPO (and its
preference losses), KTO, SimPO and ORPO on pairs. Importing the package registers them; `api` holds
the contract."""

from .api import (ExperienceObjective, Objective, PairObjective, StepLoss, objectives, policy_logprobs,
                  reference_logprobs)
from . import dpo, kto, orpo, rl, sft, simpo  # noqa: F401  (registers the built-in objectives)
from .dpo import DPOObjective
from .kto import KTOObjective
from .orpo import ORPOObjective
from .rl import RLObjective
from .sft import SFTObjective
from .simpo import SimPOObjective

__all__ = ["DPOObjective", "ExperienceObjective", "KTOObjective", "ORPOObjective", "Objective", "PairObjective",
           "RLObjective", "SFTObjective", "SimPOObjective", "StepLoss", "objectives", "policy_logprobs",
           "reference_logprobs"]
