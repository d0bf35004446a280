"""From delivered records to whole prompt groups: admission, idempotence, offsets. No Kafka here.

Offsets: a partition's committable offset is the lowest offset still held in memory (waiting in a
group or in the window), else one past the last offset seen. Committing it never skips a record
that was not trained; a record trained beyond it comes back after a restart and is skipped by id.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Iterable

from undertow.schemas import Experience, PreferencePair, Record

Partition = tuple[str, int]  # (topic, partition)


@dataclass
class Item:
    """One admitted record and where it came from."""

    record: Record
    partition: Partition
    offset: int

    @property
    def record_id(self) -> str:
        return record_id(self.record)

    @property
    def tokens(self) -> int:
        return record_tokens(self.record)


@dataclass
class Group:
    """The samples of one prompt (one record for a preference pair)."""

    group_id: str
    size: int
    items: list[Item] = field(default_factory=list)
    opened_at: float = 0.0

    @property
    def complete(self) -> bool:
        return len(self.items) >= self.size

    @property
    def tokens(self) -> int:
        return sum(i.tokens for i in self.items)

    @property
    def priority(self) -> float:
        return sum(getattr(i.record, "priority", 1.0) for i in self.items) / max(len(self.items), 1)


@dataclass
class IntakeVerdict:
    """Why a record is refused (`reason` as on the rejected topic), or None when admitted."""

    reason: str | None = None
    detail: str = ""


def record_tokens(record: Record) -> int:
    """Tokens the record puts through the model (a pair: both sequences)."""
    if isinstance(record, PreferencePair):
        return 2 * len(record.prompt_tokens) + len(record.chosen_tokens) + len(record.rejected_tokens)
    return len(record.prompt_tokens) + len(record.response_tokens)


def record_id(record: Record) -> str:
    return record.pair_id if isinstance(record, PreferencePair) else record.experience_id


def group_key(record: Record) -> tuple[str, int]:
    if isinstance(record, Experience):
        return record.group_id, record.group_size
    return record_id(record), 1


def check_experience(exp: Experience, version: int, max_staleness: int | None) -> IntakeVerdict:
    """RL admission: fresh enough, with behaviour log-probs and advantages to learn from. Staleness is
    the oldest token's: `policy_version` is the oldest of `token_versions` (schemas/experience.py), so a
    sequence that spans a weight swap counts as old as its first span."""
    if max_staleness is not None and version - exp.policy_version > max_staleness:
        spans = sorted(set(exp.token_versions))
        which = f" (oldest token's; tokens of v{', v'.join(map(str, spans))})" if len(spans) > 1 else ""
        return IntakeVerdict("stale", f"policy_version {exp.policy_version}{which} is {version - exp.policy_version} "
                                f"steps behind trainer step {version} (max_staleness {max_staleness})")
    if not exp.behaviour_logprobs:
        return IntakeVerdict("invalid", "behaviour_logprobs: empty; the rollout engine records them")
    if not exp.advantages:
        return IntakeVerdict("invalid", "advantages: empty; the processors compute them")
    return IntakeVerdict()


def batch_metrics(records: list[Record], step: int) -> dict[str, float]:
    """Staleness of a batch that step `step` trained on (with the weights of version step - 1): mean,
    max and a count per value; and the mean reward of its experiences."""
    if not records:
        return {}
    staleness = [step - 1 - getattr(r, "policy_version", 0) for r in records]
    values = {"staleness_mean": sum(staleness) / len(staleness), "staleness_max": float(max(staleness))}
    values.update({f"staleness_{s}": float(staleness.count(s)) for s in sorted(set(staleness))})
    rewards = [r for r in (getattr(record, "reward", None) for record in records) if r is not None]
    if rewards:
        values["reward_mean"] = sum(rewards) / len(rewards)
    return values


def check_tokenizer(exp: Experience, tokenizer: str | None) -> IntakeVerdict:
    """Ids are read with the trainer's tokenizer: an experience stamped with another's is refused
    (unstamped ones, from before the stamp or from outside undertow, are taken)."""
    stamped = exp.metadata.get("tokenizer")
    if tokenizer and stamped and stamped != tokenizer:
        return IntakeVerdict("tokenizer_mismatch", f"generated with tokenizer {stamped}, the trainer's is {tokenizer}")
    return IntakeVerdict()


def check_vocabulary(record: Record, vocab_size: int | None) -> IntakeVerdict:
    """Every token id must index the model's embedding: one outside [0, vocab_size) fails the forward
    pass (an IndexError on a CPU, a device-side assert that ends the process on a GPU)."""
    if vocab_size is None:
        return IntakeVerdict()
    for name, value in record:
        if not (name.endswith("_tokens") and isinstance(value, list) and value):
            continue
        if min(value) < 0 or max(value) >= vocab_size:
            bad = [t for t in value if not 0 <= t < vocab_size]
            return IntakeVerdict("token_out_of_vocabulary", f"{name}: ids {bad[:5]} are outside the model's "
                                                            f"vocabulary [0, {vocab_size})")
    return IntakeVerdict()


class TrainedIds:
    """The ids of the last `capacity` trained records, oldest forgotten first (bounded memory)."""

    def __init__(self, capacity: int, ids: Iterable[str] = ()):
        self.capacity = capacity
        self._ids: OrderedDict[str, None] = OrderedDict()
        self.update(ids)

    def __contains__(self, rid: str) -> bool:
        return rid in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def update(self, ids: Iterable[str]) -> None:
        for rid in ids:
            self._ids[rid] = None
            self._ids.move_to_end(rid)
        while len(self._ids) > self.capacity:
            self._ids.popitem(last=False)

    def to_list(self) -> list[str]:
        return list(self._ids)


class OffsetTracker:
    """Which offsets of each partition are still in flight, and what may be committed."""

    def __init__(self, start: dict[Partition, int] | None = None):
        self._next: dict[Partition, int] = dict(start or {})
        self._held: dict[Partition, set[int]] = {}

    def seen(self, partition: Partition, offset: int, held: bool) -> None:
        """A delivered record; `held` when it waits in memory (not trained or refused yet)."""
        self._next[partition] = max(self._next.get(partition, 0), offset + 1)
        if held:
            self._held.setdefault(partition, set()).add(offset)

    def done(self, partition: Partition, offset: int) -> None:
        self._held.get(partition, set()).discard(offset)

    def committable(self) -> dict[Partition, int]:
        return {p: min(self._held.get(p) or {nxt}) for p, nxt in self._next.items()}


class GroupAssembler:
    """Holds samples until their prompt group is complete (or has waited `timeout_s`)."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self._open: dict[str, Group] = {}

    def add(self, item: Item, now: float) -> Group | None:
        gid, size = group_key(item.record)
        group = self._open.setdefault(gid, Group(gid, size, opened_at=now))
        if any(i.record_id == item.record_id for i in group.items):
            return None  # redelivered before its group completed: keep the first copy
        group.items.append(item)
        if group.complete:
            return self._open.pop(gid)
        return None

    def duplicate_of_open(self, item: Item) -> bool:
        group = self._open.get(group_key(item.record)[0])
        return group is not None and any(i.record_id == item.record_id for i in group.items)

    def expired(self, now: float) -> list[Group]:
        """Incomplete groups that waited too long (a processor dropped a sample): release them."""
        old = [g for g in self._open.values() if now - g.opened_at >= self.timeout_s]
        for g in old:
            del self._open[g.group_id]
        return old

    def __len__(self) -> int:
        return len(self._open)
