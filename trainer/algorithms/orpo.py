"""ORPO: Odds Ratio Preference Optimization, SFT and preference in one loss without a reference model
(Hong et al. 2024, eq. 6-7; TRL's ORPOTrainer, whose `beta` is the paper's λ).

With P_θ(y|x) = exp(1/|y| Σ_t log π_θ(y_t | x, y_<t)), the length-normalised likelihood (TRL's
average log-probs), the odds of an answer are odds_θ(y|x) = P_θ(y|x) / (1 − P_θ(y|x)), so

    log odds_θ(y|x) = a − log(1 − e^a),        a = mean_t log π_θ(y_t | …) ≤ 0

    L_OR   = −log σ( log odds_θ(y_w|x) − log odds_θ(y_l|x) )                     eq. 7
    L_ORPO = L_SFT + λ · L_OR                                                    eq. 6

L_SFT is the negative log-likelihood of the chosen answers' tokens (a token mean over the step's
chosen tokens, as TRL's cross-entropy); L_OR is averaged over pairs.

Numbers stay finite: log(1 − e^a) is computed as log(−expm1(a)), and a is capped at −1e-6 (a
chosen answer already certain, P = 1, would have infinite odds); the cap's gradient is 0 there.
"""

from __future__ import annotations

from dataclasses import dataclass

from undertow.kernel.lazy import functional as F, torch

MAX_MEAN_LOGP = -1e-6  # P_θ(y|x) ≤ 1 − 1e-6: log(1 − P) ≥ log(1e-6) ≈ −13.8


@dataclass
class ORPOOut:
    or_losses: torch.Tensor  # [P] L_OR of each pair
    log_odds_ratio: float  # mean over pairs of log odds(y_w) − log odds(y_l)
    accuracy: float  # fraction of pairs with a positive log odds ratio


def log_odds(mean_logp: torch.Tensor) -> torch.Tensor:
    """log(P / (1 − P)) from a = log P ≤ 0, stably.  [N] -> [N]"""
    a = mean_logp.clamp(max=MAX_MEAN_LOGP)
    return a - torch.log(-torch.expm1(a))  # [N]


def odds_ratio_loss(chosen_mean_logp: torch.Tensor, rejected_mean_logp: torch.Tensor) -> ORPOOut:
    """Inputs [P]: length-normalised policy log-probs of the chosen and the rejected answer."""
    ratio = log_odds(chosen_mean_logp) - log_odds(rejected_mean_logp)  # [P]
    r = ratio.detach()
    return ORPOOut(-F.logsigmoid(ratio), r.mean().item(), (r > 0).float().mean().item())
