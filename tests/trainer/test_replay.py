"""Replay that reuses (trainer/replay.py), without a broker: the samplers' weights, the draw, the mix of
reused and fresh groups in a step, use counts and capacity, what a checkpoint keeps, and the config
that refuses a loss which cannot correct a reused record. Every number is worked out by hand below."""

from __future__ import annotations

import random

import pytest
import torch
from pydantic import ValidationError

from undertow.schemas import Experience
from undertow.trainer.algorithms import LossOut, PolicyInputs, masked
from undertow.trainer.config import TrainerConfig
from undertow.trainer.groups import Group, Item
from undertow.trainer.replay import (ReplayBuffer, ReplayGroup, age_decay, mix, priority, replay_quota, uniform)
from undertow.trainer.window import Window, weighted_order

P0 = ("ns.experiences.ready", 0)


def record(gid: str, i: int, *, size: int = 2, version: int = 0, prio: float = 1.0) -> Experience:
    """One sample: 2 prompt tokens, 3 response tokens (5 tokens)."""
    return Experience(experience_id=f"{gid}/{i}", task_id=gid, group_id=gid, group_size=size, sample_index=i,
                      prompt_tokens=[1, 2], response_tokens=[3, 4, 5], behaviour_logprobs=[-1.0] * 3,
                      advantages=[1.0] * 3, policy_version=version, finish_reason="stop", priority=prio)


def items(gid: str, *, size: int = 2, version: int = 0, prio: float = 1.0, first: int = 0) -> list[Item]:
    return [Item(record(gid, i, size=size, version=version, prio=prio), P0, first + i) for i in range(size)]


def group(gid: str, **kw) -> Group:
    its = items(gid, **kw)
    return Group(gid, len(its), its)


def held(gid: str, *, uses: int = 1, **kw) -> ReplayGroup:
    return ReplayGroup(group(gid, **kw), uses, 1)


def test_sampler_weights_by_hand():
    gs = [held("a", prio=2.0, version=6), held("b", prio=1.0, version=4), held("c", prio=0.5, version=2)]
    assert uniform(gs, 6) == [1.0, 1.0, 1.0]
    # PER eq. 1: p_i^α; α = 1 the priorities themselves, α = 0.5 their square roots, α = 0 uniform
    assert priority(gs, 6) == [2.0, 1.0, 0.5]
    assert priority(gs, 6, alpha=0.5) == pytest.approx([1.41421356, 1.0, 0.70710678])
    assert priority(gs, 6, alpha=0.0) == [1.0, 1.0, 1.0]
    # ages 6-6, 6-4, 6-2 = 0, 2, 4 versions; half-life 2: 2^0, 2^-1, 2^-2
    assert age_decay(gs, 6, half_life=2.0) == [1.0, 0.5, 0.25]
    assert age_decay(gs, 6) == pytest.approx([1.0, 0.70710678, 0.5])  # half-life 4: 2^-0.5, 2^-1


def test_the_draw_follows_the_weights_and_never_takes_a_zero():
    rng = random.Random(0)
    assert all(weighted_order("abc", [0.0, 1.0, 0.0], rng) == ["b"] for _ in range(20))
    # weights 3 : 1: the first drawn is "a" with probability 3/4 (4000 draws: σ ≈ 0.007)
    firsts = [weighted_order("ab", [3.0, 1.0], rng)[0] for _ in range(4000)]
    assert firsts.count("a") / 4000 == pytest.approx(0.75, abs=0.03)


def test_the_quota_is_the_floor_of_ratio_times_the_budget():
    assert replay_quota(0.25, 8, None) == (2, None)
    assert replay_quota(0.3, 8, None) == (2, None)  # 2.4 -> 2
    assert replay_quota(0.5, None, 101) == (None, 50)  # 50.5 tokens -> 50


def filled_window(*gids: str) -> Window:
    w = Window(capacity=10)
    for offset, gid in enumerate(gids):
        w.put(group(gid, first=10 * offset))
    return w


def test_a_step_mixes_reused_and_fresh_groups_at_the_ratio():
    buffer = ReplayBuffer(sampler="uniform", capacity=10, max_uses=3)
    w = filled_window("f1", "f2", "f3", "f4", "f5")
    # Nothing trained yet: the whole budget of 8 is fresh, 4 groups of 2.
    first = mix(w, buffer, 0.25, 1, 8, None, waited=False)
    assert [g.group_id for g in first.fresh] == ["f1", "f2", "f3", "f4"] and first.reused == []
    buffer.add([i for g in first.fresh for i in g.items], step=1)
    w.put(group("f6", first=60)), w.put(group("f7", first=70))
    # ratio 0.25 of 8 = 2 records = one reused group of 2; 8 - 2 = 6 fresh = 3 groups (f5, f6, f7)
    second = mix(w, buffer, 0.25, 1, 8, None, waited=False)
    assert len(second.reused) == 1 and second.reused[0].group.group_id in {"f1", "f2", "f3", "f4"}
    assert [g.group_id for g in second.fresh] == ["f5", "f6", "f7"]
    # ratio 0.5: 4 records = two reused groups, 4 fresh; with one fresh group (2 records) waiting: no batch
    w.put(group("f8", first=80))
    assert mix(w, buffer, 0.5, 1, 8, None, waited=False) is None
    w.put(group("f9", first=90))
    third = mix(w, buffer, 0.5, 1, 8, None, waited=False)
    assert len(third.reused) == 2 and [g.group_id for g in third.fresh] == ["f8", "f9"]
    # by tokens: a group is 2 × 5 = 10 tokens; ratio 0.25 of 40 = 10 tokens: one reused group, 30 fresh
    w2 = filled_window("t1", "t2", "t3", "t4")
    buffer.used(set())
    by_tokens = mix(w2, buffer, 0.25, 1, None, 40, waited=False)
    assert len(by_tokens.reused) == 1 and [g.group_id for g in by_tokens.fresh] == ["t1", "t2", "t3"]


def test_reuse_alone_never_makes_a_batch_and_a_group_over_the_quota_is_not_reused():
    buffer = ReplayBuffer(sampler="uniform", capacity=10, max_uses=3)
    buffer.add(items("big", size=4), step=1)
    assert mix(Window(capacity=4), buffer, 0.5, 1, 8, None, waited=True) is None  # no fresh data
    # ratio 0.25 of 8 = 2 records: a group of 4 does not fit, so the step is all fresh
    step = mix(filled_window("f1", "f2", "f3", "f4"), buffer, 0.25, 1, 8, None, waited=False)
    assert step.reused == [] and len(step.fresh) == 4


def test_the_draw_holds_until_a_step_changes_the_buffer():
    buffer = ReplayBuffer(sampler="uniform", capacity=10, max_uses=9, seed=3)
    for gid in "abcdef":
        buffer.add(items(gid), step=1)
    first = [g.group.group_id for g in buffer.draw(1, 2, None)]
    assert all([g.group.group_id for g in buffer.draw(1, 2, None)] == first for _ in range(10))
    draws = set()
    for _ in range(30):
        buffer.used(set())
        draws.add(buffer.draw(1, 2, None)[0].group.group_id)
    assert len(draws) > 1


def test_use_counts_end_a_group_and_capacity_drops_the_oldest():
    buffer = ReplayBuffer(sampler="uniform", capacity=2, max_uses=3)
    buffer.add(items("a"), step=1)
    buffer.used({"a/0", "a/1"})  # trained a second time
    assert [(g.group.group_id, g.uses) for g in buffer.groups()] == [("a", 2)]
    assert buffer.mean_uses() == 2.0
    buffer.add(items("b"), step=2)
    assert buffer.mean_uses() == 1.5  # (2·2 + 1·2) / 4 records
    buffer.used({"a/0"})  # the third training: a leaves (max_uses 3)
    assert [g.group.group_id for g in buffer.groups()] == ["b"]
    buffer.add(items("c"), step=3), buffer.add(items("d"), step=3)
    assert [g.group.group_id for g in buffer.groups()] == ["c", "d"]  # capacity 2: b, the oldest, left
    buffer.discard({"c/1"})  # a reuse no update trained
    assert [g.group.group_id for g in buffer.groups()] == ["d"]


def test_a_checkpoint_keeps_offsets_and_uses_and_a_restart_gets_them_back():
    buffer = ReplayBuffer(sampler="uniform", capacity=10, max_uses=5)
    buffer.add(items("a", first=10), step=1), buffer.add(items("b", first=20), step=2)
    buffer.used({"a/0", "a/1"})
    saved = [s.model_dump() for s in buffer.saved()]
    assert saved[0] == {"group_id": "a", "size": 2, "uses": 2, "added_step": 1, "records": [
        {"topic": P0[0], "partition": 0, "offset": 10, "record_id": "a/0"},
        {"topic": P0[0], "partition": 0, "offset": 11, "record_id": "a/1"}]}
    # what the topic gives back at those offsets; b/1's offset 21 is gone (retention): b is left out
    found = {(P0, 10): record("a", 0), (P0, 11): record("a", 1), (P0, 20): record("b", 0)}
    again = ReplayBuffer(sampler="uniform", capacity=10, max_uses=5)
    assert again.restore(buffer.saved(), found) == ["b"]
    assert [(g.group.group_id, g.uses, [i.offset for i in g.group.items]) for g in again.groups()] == [
        ("a", 2, [10, 11])]
    # another record at the offset (a topic recreated) is not taken for the one saved
    assert again.restore(buffer.saved()[:1], {(P0, 10): record("x", 0), (P0, 11): record("a", 1)}) == ["a"]


def on_policy_pg(inp: PolicyInputs, logp: torch.Tensor) -> LossOut:
    """Plain on-policy REINFORCE, L_t = −A_t log π_θ(y_t): no ratio to the behaviour policy."""
    return LossOut(masked(-inp.advantages * logp, inp.mask))


def test_replay_is_refused_for_a_loss_that_cannot_correct_and_bad_values_name_their_field():
    assert TrainerConfig.model_validate({}).replay is None  # off by default
    ok = TrainerConfig.model_validate({"replay": {"ratio": 0.5, "sampler": {"name": "age_decay", "half_life": 2}},
                                       "algorithm": {"policy_loss": "truncated_is"}})
    assert ok.replay.ratio == 0.5 and ok.replay.max_uses == 2
    with pytest.raises(ValidationError, match=r"replay: the policy_loss 'tests.trainer.test_replay.on_policy_pg' "
                                              r"has no importance ratio"):
        TrainerConfig.model_validate({"replay": {}, "algorithm": {"policy_loss": f"{__name__}.on_policy_pg"}})
    # the same loss without replay is accepted, and so is an offline objective with replay (another epoch)
    TrainerConfig.model_validate({"algorithm": {"policy_loss": f"{__name__}.on_policy_pg"}})
    TrainerConfig.model_validate({"replay": {}, "algorithm": {"objective": "sft"}})
    for bad, field in [({"ratio": 1.0}, "replay.ratio"), ({"ratio": 0}, "replay.ratio"),
                       ({"max_uses": 1}, "replay.max_uses"), ({"sampler": "lifo"}, "replay.sampler"),
                       ({"sampler": {"name": "age_decay", "halflife": 2}}, "replay.sampler"),
                       ({"capacity_groups": 0}, "replay.capacity_groups")]:
        with pytest.raises(ValidationError, match=field.replace(".", r"\.")):
            TrainerConfig.model_validate({"replay": bad})
