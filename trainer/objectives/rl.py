"""RL on experiences: a policy loss (trainer/algorithms), an optional KL to a reference (as a loss term
or an advantage penalty) and an entropy bonus, aggregated against the step's totals.

With an advantage transform (REINFORCE++'s returns, a batch whitening), `prepare` runs once per step
over the whole batch before the step loop cuts it into mini- and micro-batches, and rewrites the
records' advantages; with the KL in the reward, it is KL(π_behaviour ‖ π_ref), folded into the token
rewards there (as verl's apply_kl_penalty does with the policy that sampled), not in the loss.
With a critic (PPO: the `gae` transform, trainer/algorithms/gae.py), the same pass runs the critic
over the whole batch once: its values feed GAE, and the records come back as `ValuedExperience`,
carrying the critic's returns and old values into the step's value loss (trainer/critic.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Iterable

from undertow.kernel.lazy import torch

from undertow.schemas import Experience
from undertow.trainer.algorithms import (AdvantageInputs, AdvantageOut, PolicyInputs, Totals, advantage_transforms,
                                         aggregations, bias_corrected, explained_variance, kl_estimators,
                                         masked, masked_mean, policy_losses)
from undertow.trainer.algorithms.rollout_correction import rollout_weights
from undertow.trainer.batch import SequenceBatch, ValuedExperience

from .api import ExperienceObjective, StepLoss, column_entropy, objectives, policy_logprobs, reference_logprobs

if TYPE_CHECKING:
    from undertow.trainer.config import AlgorithmConfig


@objectives.register("rl")
class RLObjective(ExperienceObjective):
    """Policy loss + optional KL (as loss term or advantage penalty) − entropy bonus."""

    checks_staleness: ClassVar[bool] = True
    importance_sampled: ClassVar[bool] = True

    def __init__(self, algo: "AlgorithmConfig"):
        self.policy_loss = policy_losses.resolve(algo.policy_loss)
        self.aggregate = aggregations.resolve(algo.aggregation)
        self.kl = kl_estimators.resolve(algo.kl.estimator)
        self.kl_coef, self.kl_placement, self.bias_correction = algo.kl.coef, algo.kl.placement, algo.kl.bias_correction
        self.entropy_coef, self.temperature = algo.entropy_coef, algo.temperature
        self.correction = algo.rollout_correction
        transform = algo.advantage_transform
        self.transform = None if transform is None else advantage_transforms.resolve(transform)
        # A transform that reads values (gae) gets the critic's, computed in the prepare pass.
        self.reads_values = bool(self.transform and getattr(self.transform.obj, "needs_values", False))

    @property
    def needs_reference(self) -> bool:
        return self.kl_coef > 0

    @property
    def prepares_step(self) -> bool:
        """Whether the step loop calls `prepare` once over the whole batch before cutting it up."""
        return self.transform is not None

    @property
    def kl_in_rewards(self) -> bool:
        """The KL penalty is folded into the token rewards by `prepare`, not computed in the loss."""
        return self.prepares_step and self.needs_reference and self.kl_placement == "reward"

    def prepare(self, chunks: list[list[Experience]], batches: Iterable[SequenceBatch],
                ref_model: Any = None, critic: Any = None) -> tuple[list[Experience], dict[str, float]]:
        """The advantage transform over the whole step's batch (`chunks`, its records cut to fit a
        forward pass; `batches`, them collated). Returns the records, in chunk order, with the new
        advantages (with a critic: as `ValuedExperience`, with the critic's returns and old values),
        and metrics of the step."""
        records = [e for chunk in chunks for e in chunk]
        width = max(1, max(len(e.response_tokens) for e in records))
        mask = torch.zeros(len(records), width, dtype=torch.float64)  # [B, L], response-aligned
        adv = torch.zeros_like(mask)
        for i, e in enumerate(records):
            n = len(e.response_tokens)
            mask[i, :n] = torch.tensor(e.loss_mask or [1] * n, dtype=torch.float64)
            if e.advantages:
                adv[i, :n] = torch.tensor(e.advantages, dtype=torch.float64)
        rewards = torch.tensor([e.reward or 0.0 for e in records], dtype=torch.float64)  # [B]
        if self.reads_values and critic is None:
            raise ValueError("critic: the advantage_transform needs a critic's values; set trainer.critic")
        kl, values = self._per_token(chunks, batches, ref_model, critic if self.reads_values else None, width)
        kl = self.kl_coef * masked(kl, mask) if self.kl_in_rewards else torch.zeros_like(mask)
        out = self.transform.obj(AdvantageInputs(mask, adv, rewards, kl, values), **self.transform.kwargs)
        new, returns = (out.advantages, out.returns) if isinstance(out, AdvantageOut) else (out, None)  # [B, L]
        metrics = {"advantage_mean": masked_mean(new, mask).item(), "advantage_abs_max": new.abs().max().item()}
        if self.kl_in_rewards:
            metrics["kl"] = masked_mean(kl, mask).item() / self.kl_coef
        if returns is None:
            return [e.model_copy(update={"advantages": new[i, :len(e.response_tokens)].tolist()})
                    for i, e in enumerate(records)], metrics
        rows = lambda t, i: t[i, :len(records[i].response_tokens)].tolist()
        metrics.update(value_mean=masked_mean(values, mask).item(), returns_mean=masked_mean(returns, mask).item())
        explained = explained_variance(values, returns, mask)
        if explained is not None:
            metrics["explained_variance"] = explained
        return [ValuedExperience.of(e, rows(new, i), rows(returns, i), rows(masked(values, mask), i))
                for i, e in enumerate(records)], metrics

    def _per_token(self, chunks: list[list[Experience]], batches: Iterable[SequenceBatch], ref_model: Any,
                   critic: Any, width: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One forward pass per chunk: KL_t(π_behaviour ‖ π_ref) when it goes into the rewards (else 0)
        and the critic's V(s_t) when there is one (else None), of every record's response tokens,
        [B, width] float64, response-aligned."""
        if not self.kl_in_rewards and critic is None:  # nothing to run: no forward pass, no collation
            return torch.zeros(sum(len(c) for c in chunks), width, dtype=torch.float64), None
        kl_rows, value_rows = [], []

        def rows(per_token: torch.Tensor, chunk: list[Experience]) -> list[torch.Tensor]:  # [b, T-1] -> b × [width]
            per_token = per_token.detach().double().cpu()
            return [torch.nn.functional.pad(per_token[j, len(e.prompt_tokens) - 1:][:len(e.response_tokens)],
                                            (0, width - len(e.response_tokens))) for j, e in enumerate(chunk)]

        for chunk, batch in zip(chunks, batches):
            if self.kl_in_rewards:
                ref = reference_logprobs(ref_model, batch, self.temperature)  # [b, T-1]
                kl_rows += rows(self.kl.obj(batch.behaviour_logp.to(ref.dtype), ref), chunk)
            else:
                kl_rows += [torch.zeros(width, dtype=torch.float64)] * len(chunk)
            if critic is not None:
                value_rows += rows(critic.values(batch), chunk)  # [b, T-1]: V(s_t)
        return torch.stack(kl_rows), torch.stack(value_rows) if critic is not None else None

    def _agg(self, token_values: torch.Tensor, mask: torch.Tensor, totals: Totals | None) -> torch.Tensor:
        return self.aggregate.obj(token_values, mask, totals, **self.aggregate.kwargs)

    def loss(self, model: Any, batch: SequenceBatch, ref_model: Any = None, totals: Totals | None = None) -> StepLoss:
        logp, logits = policy_logprobs(model, batch, self.temperature)  # [B, T-1], [B, T-1-f, V]
        mask, advantages = batch.mask, batch.advantages
        kl_tokens = None
        if self.needs_reference and not self.kl_in_rewards:
            ref_logp = reference_logprobs(ref_model, batch, self.temperature)  # [B, T-1]
            kl_tokens = self.kl.obj(logp, ref_logp)
            if self.bias_correction:  # the tokens came from π_behaviour: weigh by π_θ/π_behaviour (TRL)
                kl_tokens = bias_corrected(kl_tokens, logp, batch.behaviour_logp)
            kl_tokens = masked(kl_tokens, mask)
            if self.kl_placement == "reward":  # a per-token reward penalty, folded into the advantage
                advantages = advantages - self.kl_coef * kl_tokens.detach()
        proximal = batch.proximal_logp if batch.proximal_logp is not None else logp.detach()
        behaviour, weights, corrected = batch.behaviour_logp, None, {}
        if self.correction is not None:  # the loss samples from π_old; w moves π_rollout's tokens to it
            c = self.correction
            weights, corrected = rollout_weights(proximal, behaviour, mask, level=c.level, threshold=c.threshold,
                                                 lower=c.lower)
            behaviour = proximal
        inputs = PolicyInputs(mask=mask, advantages=advantages, behaviour_logp=behaviour, proximal_logp=proximal)
        out = self.policy_loss.obj(inputs, logp, **self.policy_loss.kwargs)
        token_loss = out.token_loss if weights is None else weights * out.token_loss
        policy = self._agg(token_loss, mask, totals)
        loss = policy
        ent = masked(column_entropy(logits, self.temperature, mask.shape[1]), mask)  # [B, T-1]
        if self.entropy_coef:
            loss = loss - self.entropy_coef * self._agg(ent, mask, totals)
        metrics = {"entropy": masked_mean(ent.detach(), mask).item(), **out.metrics, **corrected}
        if kl_tokens is not None:
            kl_term = self._agg(kl_tokens, mask, totals)
            if self.kl_placement == "loss":
                loss = loss + self.kl_coef * kl_term
            metrics["kl"] = masked_mean(kl_tokens.detach(), mask).item()
        return StepLoss(loss, metrics, {"loss": loss.item(), "policy_loss": policy.item()})
