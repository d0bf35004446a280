"""Training algorithms as registries of small functions: policy losses, aggregations, KL estimators.

Importing this package registers every built-in; a config names one by short name or dotted path.
"""

from . import aggregation, cispo, decoupled_ppo, gmpo, gspo, kl, ppo, reinforce  # noqa: F401  (registers)
from .base import LossOut, PolicyInputs, Totals, aggregations, kl_estimators, masked, masked_mean, policy_losses
from .dpo import DPOOut, dpo_loss, preference_losses
from .kl import entropy
from .sft import sft_token_loss

__all__ = ["DPOOut", "LossOut", "PolicyInputs", "Totals", "aggregations", "dpo_loss", "entropy", "kl_estimators",
           "masked", "masked_mean", "policy_losses", "preference_losses", "sft_token_loss"]
