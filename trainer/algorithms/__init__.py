"""Training algorithms as registries of small functions: policy losses, aggregations, KL estimators and
trainer-side advantage transforms.

Importing this package registers every built-in; a config names one by short name or dotted path.
"""

from . import (advantage, aggregation, cispo, decoupled_ppo, dppo, dro, entropy_cov, gae, gmpo, gspo,  # noqa: F401
               kl, opmd, ppo, reinforce, sapo, vespo)
from .base import (AdvantageInputs, AdvantageOut, LossOut, PolicyInputs, Totals, advantage_transforms, aggregations, kl_estimators,
                   masked, masked_mean, policy_losses)
from .dpo import DPOOut, dpo_loss, preference_losses
from .gae import clipped_value_loss, explained_variance
from .kl import bias_corrected, entropy
from .sft import sft_token_loss

__all__ = ["AdvantageInputs", "AdvantageOut", "DPOOut", "LossOut", "PolicyInputs", "Totals", "advantage_transforms",
           "aggregations", "bias_corrected", "clipped_value_loss", "dpo_loss", "explained_variance", "entropy", "kl_estimators",
           "masked", "masked_mean", "policy_losses", "preference_losses", "sft_token_loss"]

# Every built-in policy loss weighs each token by a ratio to the behaviour log-probs the record keeps
# (see each file's equations), so it can learn from an older policy's records, stale or replayed. A
# user's loss says the same with the same attribute; replay (trainer/config.py) refuses one without it.
WEIGHS_BEHAVIOUR = ("ppo_clip", "dapo", "gspo", "gmpo", "cispo", "sapo", "clip_cov", "kl_cov", "dppo_tv", "dppo_kl",
                    "reinforce", "truncated_is", "decoupled_ppo", "vespo")
for _name in WEIGHS_BEHAVIOUR:
    policy_losses.get(_name).weighs_behaviour = True
