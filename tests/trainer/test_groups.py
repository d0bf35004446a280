"""Admission, idempotence, offsets, group assembly and the batch window, without a broker."""

from __future__ import annotations

from tests.helpers import trainable
from undertow.trainer.groups import (GroupAssembler, Item, OffsetTracker, TrainedIds, batch_metrics, check_experience,
                                     check_tokenizer)
from undertow.trainer.window import Window

P0, P1 = ("ready", 0), ("ready", 1)


def test_stale_and_incomplete_experiences_are_refused_with_reasons():
    assert check_experience(trainable("g", 0, version=3), version=5, max_staleness=2).reason is None
    stale = check_experience(trainable("g", 0, version=2), version=5, max_staleness=2)
    assert stale.reason == "stale" and "3 steps behind" in stale.detail
    assert check_experience(trainable("g", 0).model_copy(update={"advantages": []}), 0, 4).reason == "invalid"
    assert check_experience(trainable("g", 0).model_copy(update={"behaviour_logprobs": []}), 0, 4).reason == "invalid"


def test_a_sequence_spanning_a_swap_is_as_stale_as_its_oldest_token():
    # Tokens sampled by v2, v3, v3 (an in-flight swap after the first): policy_version is the oldest, 2,
    # so at trainer step 5 it is 3 steps behind, past max_staleness 2, though most tokens are only 2.
    spanning = trainable("g", 0, version=2, token_versions=[2, 3, 3])
    stale = check_experience(spanning, version=5, max_staleness=2)
    assert stale.reason == "stale"
    assert stale.detail == ("policy_version 2 (oldest token's; tokens of v2, v3) is 3 steps behind trainer step 5 "
                            "(max_staleness 2)")
    assert check_experience(trainable("g", 0, version=3, token_versions=[3, 4, 4]), 5, 2).reason is None


def test_experiences_of_another_tokenizer_are_refused():
    stamped = lambda fp: trainable("g", 0).model_copy(update={"metadata": {"tokenizer": fp}})
    assert check_tokenizer(stamped("0123456789abcdef"), "0123456789abcdef").reason is None
    other = check_tokenizer(stamped("fedcba9876543210"), "0123456789abcdef")
    assert other.reason == "tokenizer_mismatch" and "fedcba9876543210" in other.detail
    assert check_tokenizer(trainable("g", 0), "0123456789abcdef").reason is None  # unstamped: from before the stamp
    assert check_tokenizer(stamped("fedcba9876543210"), None).reason is None  # a trainer that checks nothing


def test_a_batchs_staleness_and_reward_by_hand():
    # Step 5 trained with the weights of version 4: versions 4, 4, 2 are 0, 0 and 2 steps stale.
    records = [trainable("a", 0, version=4), trainable("a", 1, version=4), trainable("b", 0, version=2)]
    records = [r.model_copy(update={"reward": w}) for r, w in zip(records, (1.0, 0.0, 0.5))]
    assert batch_metrics(records, 5) == {"staleness_mean": 2 / 3, "staleness_max": 2.0, "staleness_0": 2.0,
                                         "staleness_2": 1.0, "reward_mean": 0.5}
    assert batch_metrics([], 5) == {}


def test_trained_ids_are_bounded_oldest_first():
    ids = TrainedIds(3, ["a", "b"])
    ids.update(["c", "a", "d"])  # "a" refreshed, so "b" is the oldest and goes
    assert ids.to_list() == ["c", "a", "d"] and "b" not in ids and len(ids) == 3


def test_offsets_commit_only_up_to_the_oldest_held_record():
    t = OffsetTracker({P1: 7})
    for o in range(4):
        t.seen(P0, o, held=o != 1)  # offset 1 was refused (not held)
    assert t.committable() == {P0: 0, P1: 7}
    t.done(P0, 0)
    assert t.committable() == {P0: 2}  | {P1: 7}
    t.done(P0, 2), t.done(P0, 3)
    assert t.committable()[P0] == 4


def test_groups_complete_or_time_out():
    a = GroupAssembler(timeout_s=10)
    assert a.add(Item(trainable("g", 0), P0, 0), now=0) is None
    assert a.add(Item(trainable("g", 0), P0, 5), now=1) is None  # a redelivered copy is not a second sample
    group = a.add(Item(trainable("g", 1), P0, 1), now=2)
    assert group is not None and [i.offset for i in group.items] == [0, 1]
    a.add(Item(trainable("h", 0, size=3), P0, 2), now=3)
    assert a.expired(now=12) == [] and len(a.expired(now=13)[0].items) == 1 and len(a) == 0


def groups(*specs):
    out = []
    a = GroupAssembler(60)
    for gid, size, priority, tokens in specs:
        for i in range(size):
            g = a.add(Item(trainable(gid, i, size, priority=priority, tokens=tokens), P0, 0), 0)
        out.append(g)
    return out


def test_window_batches_whole_groups_by_count_or_tokens():
    w = Window(capacity=10)
    for g in groups(("a", 2, 1, 3), ("b", 4, 1, 3), ("c", 2, 1, 3)):
        w.put(g)
    assert w.ready(experiences=8, token_budget=None)
    assert [g.group_id for g in w.take(experiences=5, token_budget=None)] == ["a"]  # b would overflow 5
    # prompt tokens 2 + response 3 = 5 per sample: b is 20 tokens, c 10 (b and c: 30)
    assert [g.group_id for g in w.take(experiences=None, token_budget=29)] == ["b"]
    assert [g.group_id for g in w.take(experiences=None, token_budget=1)] == ["c"]  # one group at least
    assert len(w) == 0


def test_prioritized_window_draws_high_priority_groups_first():
    firsts = []
    for seed in range(20):
        w = Window(capacity=10, prioritized=True, seed=seed)
        for g in groups(("low", 1, 0.01, 3), ("high", 1, 100.0, 3)):
            w.put(g)
        firsts.append(w.take(experiences=1, token_budget=None)[0].group_id)
    assert firsts.count("high") >= 19
    w = Window(capacity=2)
    w.put(groups(("x", 1, 1, 1))[0]), w.put(groups(("y", 1, 1, 1))[0])
    assert w.full


def test_window_knows_the_records_it_holds_until_taken_or_dropped():
    """A redelivered copy of a record waiting in the window must be seen as a duplicate (trained once)."""
    w = Window(capacity=10)
    g, h = groups(("g", 2, 1, 1), ("h", 2, 1, 1))
    w.put(g), w.put(h)
    assert "g/0" in w and "h/1" in w
    w.take(experiences=2, token_budget=None)
    assert "g/0" not in w and "h/0" in w
    w.remove(lambda group: group.group_id != "h")
    assert "h/0" not in w and len(w) == 0
