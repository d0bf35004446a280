"""Admission control and weight reassembly (pure parts of the worker)."""

from __future__ import annotations

import pytest

from undertow.schemas import WeightIntegrityError, chunk_weights
from undertow.rollout.admission import Admission
from undertow.streams.weights import WeightAssembler


def test_admission_waits_when_weights_are_too_old():
    a = Admission(max_staleness=1)
    assert a.reason_to_wait() is None
    a.trainer_announced(1)
    assert a.reason_to_wait() is None          # 1 - 0 <= 1
    a.trainer_announced(2)
    assert "behind" in a.reason_to_wait()       # 2 - 0 > 1
    a.weights_loaded(2)
    assert a.reason_to_wait() is None


def test_on_policy_waits_for_every_version():
    a = Admission(max_staleness=0)
    a.trainer_announced(1)
    assert a.reason_to_wait() is not None
    a.weights_loaded(1)
    assert a.reason_to_wait() is None


def test_admission_counts_over_the_run_as_areal_does():
    # AReaL's N_r <= (i + eta + 1) * B with eta = max_staleness = 1, B = 4, counted from v0.
    a = Admission(max_staleness=1, experiences_per_version=4)
    a.trainer_announced(0)
    a.published(7)
    assert a.reason_to_wait() is None          # 7 < (0 + 1 + 1) * 4 = 8
    a.published(1)
    assert a.reason_to_wait() == "published 8 >= 8 experiences by trainer v0 (counted from v0)"
    a.trainer_announced(1)                      # (1 + 2) * 4 = 12: room for 4 more, not a fresh 8
    a.weights_loaded(1)                         # (made with v0 they would be 2 stale: condition 3 below)
    assert a.reason_to_wait() is None and a.room() == 4
    a.published(4)
    assert "12 >= 12" in a.reason_to_wait()
    a.trainer_announced(3)                      # (3 + 2) * 4 = 20
    assert a.room() == 8


def test_a_worker_waits_for_announced_weights_rather_than_make_what_would_be_stale_in_the_queue():
    # B = 4, max_staleness 1, from v0. The 9th experience is trained at v0 + 8 // 4 = v2: made with v0,
    # 2 stale (dropped); made with v1, 1. So with v1 announced and not loaded, the worker waits for it.
    a = Admission(max_staleness=1, experiences_per_version=4)
    a.trainer_announced(0)
    a.published(4)
    assert a.queued_staleness() == 1 and a.reason_to_wait() is None   # the 5th: trained at v1, made with v0
    a.published(4)
    a.trainer_announced(1)
    assert a.queued_staleness() == 2
    assert a.reason_to_wait() == ("v1 announced, its weights not in yet: made with v0 the next experience "
                                  "would be 2 versions stale when trained")
    a.weights_loaded(1)
    assert a.queued_staleness() == 1 and a.reason_to_wait() is None
    # Nothing newer announced: the held weights are the newest there are, the worker generates.
    b = Admission(max_staleness=0, experiences_per_version=4, cap_wait_s=1)
    b.trainer_announced(0)
    b.published(4)
    b.reason_to_wait(now=0.0)
    assert b.queued_staleness() == 1 and b.reason_to_wait(now=2.0) is None   # the valve, not condition 3


def test_a_fast_worker_publishes_what_the_trainer_takes_plus_the_staleness_lead():
    # The bug this rule fixes: a worker that fills its budget at every version published
    # (max_staleness + 1) * B per version, 3x what the trainer takes with max_staleness 2.
    a = Admission(max_staleness=2, experiences_per_version=4)
    a.trainer_announced(0)
    total = 0
    for version in range(10):
        a.trainer_announced(version)
        total += a.room()
        a.published(a.room())                   # the worker is always faster: it fills the budget
    # (9 + 2 + 1) * 4 = 48 by v9: the trainer took 10 * 4 = 40 (v0..v9), the lead is 8 = 2 * 4.
    # Counted per version it was 10 * (2 + 1) * 4 = 120.
    assert total == 48


def test_a_worker_that_joins_late_gets_no_credit_for_versions_before_it():
    a = Admission(max_staleness=1, experiences_per_version=4)
    a.trainer_announced(5)
    assert a.room() == 8                        # (5 - 5 + 1 + 1) * 4, not (5 + 2) * 4 = 28
    a.published(8)
    a.trainer_announced(6)
    assert a.room() == 4


def test_a_capped_worker_goes_on_when_the_trainer_announces_nothing_for_cap_wait_s():
    a = Admission(max_staleness=0, experiences_per_version=4, cap_wait_s=60)
    a.trainer_announced(0)
    a.published(4)
    assert a.reason_to_wait(now=100.0) is not None   # capped from t=100: 4 >= (0 + 0 + 1) * 4
    assert a.reason_to_wait(now=159.0) is not None
    assert a.reason_to_wait(now=160.0) is None       # the trainer said nothing for 60 s: 4 more
    assert a.valve_opened == 1 and a.room() == 4
    a.published(4)
    assert a.reason_to_wait(now=161.0) is not None   # and the clock starts again
    a.trainer_announced(1)
    a.weights_loaded(1)
    # (1 + 0 + 1) * 4 + the valve's 4 = 12, 8 published
    assert a.reason_to_wait(now=162.0) is None and a.capped_since is None and a.room() == 4


def chunks(version: int, blob: bytes):
    return chunk_weights("policy", version, blob, 4)


def test_assembler_joins_chunks_in_any_order_and_ignores_old_versions():
    asm = WeightAssembler("policy")
    c = chunks(1, b"0123456789")
    assert asm.add(c[2]) is None and asm.add(c[0]) is None and asm.add(c[0]) is None
    done = asm.add(c[1])
    assert (done.version, done.blob) == (1, b"0123456789")
    assert asm.add(chunks(1, b"0123456789")[0]) is None          # redelivery of an assembled version
    assert asm.add(chunk_weights("other", 5, b"x", 4)[0]) is None  # another model's update


def test_assembler_and_admission_follow_a_trainer_that_resumed_from_a_checkpoint():
    asm, adm = WeightAssembler("policy"), Admission(max_staleness=1, experiences_per_version=4)
    assert [asm.add(c) for c in chunks(3, b"weights3")][-1].version == 3
    adm.weights_loaded(3)
    adm.published(8)
    assert adm.reason_to_wait() is not None  # (3 - 3 + 1 + 1) * 4 = 8, counted from v3, is used up
    # The trainer died after publishing v3 and resumed from its step-2 checkpoint.
    rewound = [asm.add(c) for c in chunks(2, b"resumed2")]
    assert rewound[-1].version == 2 and rewound[-1].blob == b"resumed2"
    adm.trainer_announced(2)
    adm.weights_loaded(2)
    assert adm.held == 2 and adm.reason_to_wait() is None  # follows it back; the count starts again from v2
    assert adm.room() == 8
    assert [asm.add(c) for c in chunks(3, b"retrained3")][-1].blob == b"retrained3"


def test_a_resume_seen_only_inside_one_poll_still_starts_the_count_again():
    from undertow.rollout.weight_subscriber import newest_announcements, resumed_from
    from undertow.schemas import WeightUpdate

    def announcement(version: int, model: str = "policy") -> WeightUpdate:
        return WeightUpdate(model=model, version=version, transport="files", uri=f"/w/{version}", total_bytes=8,
                            sha256="0" * 64)

    adm = Admission(max_staleness=1, experiences_per_version=4)
    adm.trainer_announced(40)
    adm.weights_loaded(40)
    adm.published(8)
    adm.trainer_announced(50)
    adm.weights_loaded(49)
    adm.published(40)
    assert adm.reason_to_wait() is not None  # (50 - 40 + 1 + 1) * 4 = 48 published by v50
    # Killed at v50, the trainer resumed from its v40 checkpoint and replayed to v50 while the worker's
    # weights thread was busy: one poll holds all of it, and its newest announcement is v50 again.
    # The 48 include experiences made with v49 that the resumed trainer drops as stale; counted on,
    # they would hold the worker until the valve opened (cap_wait_s, 300 s by default).
    poll = [announcement(40), announcement(7, "critic")] + [announcement(v) for v in range(41, 51)]
    assert [u.version for u in newest_announcements(poll) if u.model == "policy"] == [50]
    assert resumed_from(poll, "policy", before=50) == 40
    assert resumed_from(poll, "policy", before=39) is None and resumed_from(poll, "critic", before=50) == 7
    assert resumed_from([announcement(51), announcement(51), announcement(52)], "policy", before=51) is None
    adm.trainer_resumed(40)
    adm.trainer_announced(50)
    assert adm.reason_to_wait() is None and adm.room() == 48


def test_assembler_refuses_a_bad_checksum_and_goes_on():
    asm = WeightAssembler("policy")
    bad = chunks(2, b"abcdefgh")
    bad[1] = bad[1].model_copy(update={"data": b"XXXX"})
    asm.add(bad[0])
    with pytest.raises(WeightIntegrityError, match="sha256"):
        asm.add(bad[1])
    assert asm.newest == -1 and asm.pending == {}
    good = chunks(3, b"abcdefgh")
    asm.add(good[0])
    assert asm.add(good[1]).version == 3
