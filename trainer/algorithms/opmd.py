"""OPMD's policy loss, as Trinity-RFT computes it (its `opmd` policy loss, paired with the `opmd` or
`asymre` advantage of the processors):

    L_t = −A_t · log π_θ(y_t) / (1 + τ)

the REINFORCE gradient, scaled by 1/(1 + τ): one step of mirror descent on the KL-regularised
objective with temperature τ around the current policy. No importance weight: Trinity applies it to
slightly stale samples as they are.
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import LossOut, PolicyInputs, masked, policy_losses


@policy_losses.register("opmd")
def opmd(inp: PolicyInputs, logp: torch.Tensor, *, tau: float = 1.0) -> LossOut:
    """Trinity-RFT's OPMD loss; `tau` (τ >= 0) the regularisation's temperature."""
    if tau < 0:
        raise ValueError(f"tau: expected >= 0, got {tau}")
    return LossOut(masked(-inp.advantages * logp / (1.0 + tau), inp.mask))
