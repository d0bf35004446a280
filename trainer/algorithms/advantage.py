"""Trainer-side advantage transforms: applied once per step over the WHOLE batch, before it is cut into
mini- and micro-batches (every rank holds the whole batch and computes the same thing), so the
result does not depend on how the step is cut. The processors see one prompt group at a time and no
reference model; what needs the batch's statistics or the reference's per-token KL happens here.

A transform takes `AdvantageInputs` (response-aligned [B, L] tensors; see base.py) and returns the
advantages [B, L] the policy loss will see; it is 0 where `mask` is 0. One marked `needs_values`
(gae.py: PPO's GAE) also gets the critic's values and returns an `AdvantageOut`, the advantages and
the returns the critic regresses on; configuring it requires `trainer.critic`.

    batch_whiten   A_t ← whiten(A_t − β KL_t)                       REINFORCE++-baseline's second half
    reinforce_pp   r_t = −β KL_t (+ the outcome reward on the last trained token)
                   G_t = Σ_{s≥t} γ^(s−t) r_s,   A_t = whiten(G_t)    REINFORCE++ (Hu 2025)
    gpg            A_i ← α A_i / f_norm,  α = B / #{i : r_i ≠ 0}      GPG as verl computes it
with whiten(x) = (x − mean) / sqrt(var + 1e-8): mean and the unbiased variance over every trained
token of the step (verl's masked_whiten).
"""

from __future__ import annotations

from undertow.kernel.lazy import torch

from .base import AdvantageInputs, advantage_transforms, masked

WHITEN_EPS = 1e-8  # verl's masked_whiten


def whiten(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(x − mean) · rsqrt(var + 1e-8) over the tokens where mask is on (var with Bessel's correction,
    as verl's masked_whiten). With fewer than 2 such tokens there is no spread to measure: x − mean,
    which is 0 (verl raises instead)."""
    n = mask.sum()
    if n < 1:
        return torch.zeros_like(x)
    mean = masked(x, mask).sum() / n
    centred = masked(x - mean, mask)  # [B, L]
    if n < 2:
        return centred
    var = (centred ** 2).sum() / (n - 1)
    return centred * torch.rsqrt(var + WHITEN_EPS)


@advantage_transforms.register("batch_whiten")
def batch_whiten(inp: AdvantageInputs) -> torch.Tensor:
    """REINFORCE++-baseline (Hu 2025, arXiv 2501.03262; verl's
    compute_reinforce_plus_plus_baseline_outcome_advantage): the processors subtract the group's mean
    reward (`dr_grpo`), this whitens the result over the whole batch's tokens, so the scale comes from
    the batch, not from one small group (GRPO's per-group std). With the KL in the reward, β KL_t is
    subtracted per token first."""
    return whiten(inp.advantages - inp.kl_penalty, inp.mask)


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + γ G_{t+1} over the trained tokens of each row, right to left. An untrained token
    inside a response (a tool's output) is skipped: it carries the return through without a reward or a
    discount step. verl resets the running return there instead, which cuts a multi-turn answer's
    outcome reward off from the turns before the tool call; the two agree when nothing is masked."""
    out = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])  # [B]
    on = mask > 0
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(on[:, t], rewards[:, t] + gamma * running, running)
        out[:, t] = running
    return masked(out, mask)


@advantage_transforms.register("reinforce_pp")
def reinforce_pp(inp: AdvantageInputs, *, gamma: float = 1.0) -> torch.Tensor:
    """REINFORCE++ (Hu 2025, arXiv 2501.03262): no critic and no group baseline. The token
    reward is the KL penalty, with the outcome reward added on the answer's last trained token; the
    advantage is the discounted return, whitened over every trained token of the batch (global
    normalisation instead of GRPO's per-prompt one). Checked against verl's
    compute_reinforce_plus_plus_outcome_advantage. The processors' advantages are ignored."""
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma: expected a discount in [0, 1], got {gamma}")
    token_rewards = outcome_rewards(inp.rewards, inp.mask) - inp.kl_penalty  # [B, L]
    return whiten(discounted_returns(token_rewards, inp.mask, gamma), inp.mask)


@advantage_transforms.register("gpg")
def gpg(inp: AdvantageInputs, *, f_norm: float = 1.0) -> torch.Tensor:
    """GPG's correction as verl's compute_gpg_outcome_advantage makes it: the processors' r − mean
    (`dr_grpo`) times α = B / (the step's sequences with a non-zero reward), divided by `f_norm`.
    The paper's α = B / (B − M) counts the M samples of groups with no signal instead; the `gpg`
    preset's default gets that correction by dropping those groups (dynamic sampling)."""
    if f_norm <= 0:
        raise ValueError(f"f_norm: expected a normaliser > 0, got {f_norm}")
    alpha = inp.rewards.shape[0] / max(int(torch.count_nonzero(inp.rewards)), 1)
    return masked(inp.advantages * (alpha / f_norm), inp.mask)


def outcome_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The outcome reward of each row [B] on its last trained token, 0 elsewhere: [B, L]. A row with
    nothing trained gets nothing."""
    positions = torch.arange(mask.shape[1], device=mask.device)  # [L]
    last = torch.where(mask > 0, positions, -1).max(-1).values  # [B], −1 for a row with nothing trained
    outcome = torch.zeros_like(mask)
    rows = (last >= 0).nonzero().squeeze(-1)
    outcome[rows, last[rows]] = rewards[rows].to(mask.dtype)
    return outcome
