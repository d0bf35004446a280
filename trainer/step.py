"""One training step on a rollout batch: PPO epochs × mini-batches of optimizer updates, each
accumulated over micro-batches that fit a token budget.

    for epoch in 1..ppo_epochs:
        for each of the `mini_batches` mini-batches:             one optimizer update
            for each micro-batch of this rank's shard:           forward + backward, gradients add up
                L_micro = world_size · Σ_micro w_t L_t           w from the mini-batch's totals
            step()                                               DeepSpeed averages over the ranks
The totals (trained tokens, sequences) are the whole mini-batch's, over all micro-batches and ranks,
so the accumulated gradient is exactly the one pass's (world_size undoes the ranks' mean). Every rank
holds the whole batch (the relay sends it to all), so every rank knows every total without talking.

The proximal policy of decoupled PPO is the weights before the first update: with more than one
update per step, its log-probs are computed up front, once. So is an objective's `prepare` (a
trainer-side advantage transform: REINFORCE++'s returns, a batch whitening, GAE from a critic's values):
once per step, over the whole batch, before the batch is cut up, identically on every rank; so the cut
changes nothing. A critic (PPO) is a second engine accumulated over the same micro-batches against
the same totals, and stepped in the same updates.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Callable

import torch

from undertow.schemas import Record

from .algorithms import Totals
from .engine import Process
from .groups import record_id, record_tokens
from .objectives import Objective
from .optim import finite_guard
from .relay import collective_device, shard


@dataclass(frozen=True)
class StepShape:
    """How a step's batch is cut up (the `trainer:` settings of the same names)."""

    micro_batch_tokens: int | None = None
    mini_batches: int = 1
    ppo_epochs: int = 1
    pad_to_multiple: int = 8


@dataclass
class Update:
    """One optimizer update: this rank's micro-batches and the normalisers of the whole mini-batch."""

    records: list[Record]  # the mini-batch, every rank's share
    micro: list[list[Record]]  # this rank's micro-batches; [] pads to the count of the busiest rank
    totals: Totals


def padded_cost(lengths: list[int], multiple: int) -> int:
    """Tokens a micro-batch of sequences of these lengths occupies once right-padded."""
    return len(lengths) * -(-max(lengths) // multiple) * multiple


def pack(records: list[Record], objective: Objective, budget: int | None, multiple: int) -> list[list[Record]]:
    """Records into micro-batches of at most `budget` padded tokens (one record over budget goes
    alone): the rows of one prompt together, so that its forward pass runs once for them all
    (objectives/shared_prefix.py), and the prompt with the longest row first."""
    if not records:
        return []
    if budget is None:
        return [records]
    keyed = [(tuple(getattr(r, "prompt_tokens", ())), objective.lengths(r), r) for r in records]
    longest: dict[tuple[int, ...], int] = {}
    for prompt, own, _ in keyed:
        longest[prompt] = max(longest.get(prompt, 0), *own)
    keyed.sort(key=lambda k: (-longest[k[0]], k[0], -max(k[1])))
    micro: list[list[Record]] = [[]]
    lengths: list[int] = []
    for _, own, r in keyed:
        if micro[-1] and padded_cost(lengths + own, multiple) > budget:
            micro.append([])
            lengths = []
        micro[-1].append(r)
        lengths += own
    return micro


def plan(records: list[Record], objective: Objective, shape: StepShape, rank: int, world_size: int) -> list[Update]:
    """The updates of one epoch, as this rank runs them. Every rank runs as many micro-batches per
    update as the busiest rank, because ZeRO-2 reduces gradients inside every backward."""
    n, m = len(records), shape.mini_batches
    minis = [records[i * n // m:(i + 1) * n // m] for i in range(m)]
    updates = []
    for mini in (b for b in minis if b):
        packs = [pack(shard(mini, r, world_size), objective, shape.micro_batch_tokens, shape.pad_to_multiple)
                 for r in range(world_size)]
        count = max(len(p) for p in packs)
        updates.append(Update(mini, packs[rank] + [[]] * (count - len(packs[rank])), objective.totals(mini)))
    return updates


def prepare_step(objective: Objective, records: list[Record], ref_model: Any, shape: StepShape,
                 collate: Callable[[list[Record]], Any], critic: Any = None) -> tuple[list[Record], dict[str, float]]:
    """The objective's pass over the whole step's batch, if it has one (`prepares_step`): every rank
    runs it on every record, in forward passes of at most `micro_batch_tokens` (with a critic, its
    values too). Returns the records in their order, as the objective rewrote them, and its metrics."""
    if not getattr(objective, "prepares_step", False):
        return records, {}
    chunks = pack(records, objective, shape.micro_batch_tokens, shape.pad_to_multiple)
    extra = {} if critic is None else {"critic": critic}
    prepared, metrics = objective.prepare(chunks, (collate(c) for c in chunks), ref_model, **extra)
    by_id = {record_id(r): r for r in prepared}
    return [by_id[record_id(r)] for r in records], metrics


def to_device(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a (nested) batch dataclass to `device`."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device)
    if is_dataclass(batch):
        return type(batch)(**{f.name: to_device(getattr(batch, f.name), device) for f in fields(batch)})
    return batch


class Tally:
    """Metrics of a step: loss parts add up within an update (then average over updates), token
    means weigh by tokens, `_min` / `_max` take the extreme; reduced over the ranks."""

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.weights: dict[str, float] = {}
        self.extremes: dict[str, float] = {}
        self.parts: dict[str, float] = {}

    def add(self, metrics: dict[str, float], parts: dict[str, float], tokens: float, *, real: bool = True) -> None:
        """A padding micro-batch (`real` False) adds its keys but no values: every rank must
        reduce the same keys."""
        for k, v in metrics.items():
            if k.endswith("_min") or k.endswith("_max"):
                low = k.endswith("_min")
                v = v if real else (math.inf if low else -math.inf)
                self.extremes[k] = (min if low else max)(self.extremes.get(k, v), v)
            else:
                self.sums[k] = self.sums.get(k, 0.0) + (v * tokens if real else 0.0)
                self.weights[k] = self.weights.get(k, 0.0) + (tokens if real else 0.0)
        for k, v in parts.items():
            self.parts[k] = self.parts.get(k, 0.0) + (v if real else 0.0)

    def result(self, updates: int, world_size: int) -> dict[str, float]:
        keys = sorted(self.sums)
        sums = [self.sums[k] for k in keys] + [self.weights[k] for k in keys] + \
            [self.parts[k] for k in sorted(self.parts)]
        mins = {k: v for k, v in self.extremes.items() if k.endswith("_min")}
        maxs = {k: v for k, v in self.extremes.items() if k.endswith("_max")}
        if world_size > 1:
            sums, mins, maxs = _all_reduce(sums, "sum"), _reduce_dict(mins, "min"), _reduce_dict(maxs, "max")
        n = len(keys)
        out = {k: sums[i] / sums[n + i] if sums[n + i] else 0.0 for i, k in enumerate(keys)}
        out.update({k: sums[2 * n + i] / max(updates, 1) for i, k in enumerate(sorted(self.parts))})
        return {**out, **mins, **maxs}


def _all_reduce(values: list[float], op: str) -> list[float]:
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=collective_device())
    dist.all_reduce(t, op={"sum": dist.ReduceOp.SUM, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX}[op])
    return t.tolist()


def _reduce_dict(values: dict[str, float], op: str) -> dict[str, float]:
    keys = sorted(values)
    return dict(zip(keys, _all_reduce([values[k] for k in keys], op)))


def accumulate(model: Any, objective: Objective, update: Update, batches: list[Any], ref_model: Any, world_size: int,
               backward: Callable[[torch.Tensor], Any], tally: Tally) -> None:
    """Forward and backward every micro-batch of one update; the gradients add up to the update's."""
    for micro, batch in zip(update.micro, batches):
        out = objective.loss(model, batch, ref_model, update.totals)
        # An empty (padding) micro-batch still runs: the ranks' gradient reductions must pair up.
        backward(out.loss * (world_size if micro else 0.0))
        tally.add(out.metrics, out.parts, objective.totals(micro).tokens if micro else 0.0, real=bool(micro))


@dataclass
class TrainStepResult:
    """What a step did: its metrics, and the records no applied update trained on (non-finite)."""

    metrics: dict[str, float]
    untrained: list[Record]
    failure: str | None = None  # the step raised: every record is untrained, this says why


def train_step(engine: Any, objective: Objective, records: list[Record], ref_model: Any, process: Process, *,
               pad_id: int, shape: StepShape = StepShape(), critic: Any = None) -> TrainStepResult:
    """Every update of one step on this rank; metrics are over all ranks (every rank gets them). With a
    `critic` (trainer/critic.py), its values feed the prepare pass and its value loss is accumulated
    over the same micro-batches in every update, after which its own engine steps too."""
    started = time.perf_counter()
    received = records  # what a caller gets back untrained: never the transformed advantages
    collate = lambda rs: to_device(objective.collate(rs or records[:1], pad_id=pad_id,
                                                     pad_to_multiple=shape.pad_to_multiple), process.device)
    records, prepared = prepare_step(objective, records, ref_model, shape, collate, critic)
    updates = plan(records, objective, shape, process.rank, process.world_size)
    batches = [[collate(m) for m in u.micro] for u in updates]
    if len(updates) * shape.ppo_epochs > 1:  # else the proximal policy is the current one
        batches = [[_with_proximal(b, objective.logprobs(engine, b)) for b in bs] for bs in batches]
    guard, tally = finite_guard(engine), Tally()
    trained: set[str] = set()
    applied = skipped = critic_applied = 0
    grad_norms: list[float | None] = []
    critic_norms: list[float | None] = []
    for _ in range(shape.ppo_epochs):
        for update, micro_batches in zip(updates, batches):
            accumulate(engine, objective, update, micro_batches, ref_model, process.world_size,
                       lambda loss: engine.backward(loss, scale_wrt_gas=False), tally)
            if critic is not None:  # the same micro-batches, into the critic's own gradients
                accumulate(critic.model, critic, update, micro_batches, None, process.world_size,
                           lambda loss: critic.model.backward(loss, scale_wrt_gas=False), tally)
                if critic.step():
                    critic_applied += 1
                    critic_norms.append(_finite_norm(critic.model))
            guard.applied = False
            engine.step()
            if not guard.applied:
                skipped += 1
                continue
            applied += 1
            trained.update(record_id(r) for r in update.records)
            grad_norms.append(_finite_norm(engine))
    seconds = time.perf_counter() - started
    tokens = sum(record_tokens(r) for r in records)  # the whole batch, over all ranks
    metrics = {**prepared, **tally.result(len(updates) * shape.ppo_epochs, process.world_size),
               "updates": float(applied), "skipped_updates": float(skipped), "lr": float(engine.get_lr()[0]),
               "step_s": seconds, "tokens": float(tokens), "tokens_per_s": tokens / seconds if seconds > 0 else 0.0}
    for key, norms in (("grad_norm", grad_norms), ("critic_grad_norm", critic_norms)):
        norms = [n for n in norms if n is not None]
        if norms:
            metrics[key] = sum(norms) / len(norms)
    if critic is not None:
        metrics.update(critic_updates=float(critic_applied), critic_lr=float(critic.model.get_lr()[0]))
    return TrainStepResult(metrics, [r for r in received if record_id(r) not in trained])


def _finite_norm(engine: Any) -> float | None:
    """The gradient norm of the engine's last step, if it reported a finite one."""
    norm = engine.get_global_grad_norm()
    return float(norm) if norm is not None and math.isfinite(float(norm)) else None


def _with_proximal(batch: Any, logp: torch.Tensor | None) -> Any:
    return batch if logp is None else replace(batch, proximal_logp=logp)
