"""Training algorithms as registries of small functions: policy losses, aggregations, KL estimators and
trainer-side advantage transforms.

Importing this package registers every built-in; a config names one by short name or dotted path.
"""

from . import (advantage, aggregation, cispo, decoupled_ppo, dppo, entropy_cov, gmpo, gspo, kl,  # noqa: F401  (registers)
               ppo, reinforce, sapo)
from .base import (AdvantageInputs, LossOut, PolicyInputs, Totals, advantage_transforms, aggregations, kl_estimators,
                   masked, masked_mean, policy_losses)
from .dpo import DPOOut, dpo_loss, preference_losses
from .kl import bias_corrected, entropy
from .sft import sft_token_loss

__all__ = ["AdvantageInputs", "DPOOut", "LossOut", "PolicyInputs", "Totals", "advantage_transforms", "aggregations",
           "bias_corrected", "dpo_loss", "entropy", "kl_estimators",
           "masked", "masked_mean", "policy_losses", "preference_losses", "sft_token_loss"]
