"""Schema evolution: version-1 bytes (stored on 2026-12-03, before Experience v2 added per-token
behaviour versions) decode today through the real upgrader, and after a test-only bump of Experience
to v3 through both upgraders, on the wire and from the archive's Parquet; newer is refused."""

from pathlib import Path
from typing import ClassVar

import msgpack
import pyarrow.parquet as pq
import pytest

from undertow.schemas import (
    UPGRADERS,
    DecodeError,
    Experience,
    UpgradeError,
    current_version,
    decode,
    encode,
    from_arrow,
    record_types,
    upgrader,
)
from undertow.schemas import base
from tests.record_examples import T0, make_examples

V1 = Path(__file__).parents[1] / "fixtures" / "schemas" / "v1"
V2 = V1.parent / "v2"  # experience v2 (token_versions), written by the code of 2026-12-03 after the bump
KINDS = sorted(record_types())
UNCHANGED = [k for k in KINDS if k != "experience"]


def pinned() -> dict:
    """The examples exactly as the fixtures were written (the weight update's created_at is time.time())."""
    examples = make_examples()
    examples["weight_update"] = examples["weight_update"].model_copy(update={"created_at": T0})
    return examples


def test_a_fixture_for_every_kind():
    assert sorted(p.stem for p in V1.glob("*.bin")) == KINDS


@pytest.mark.parametrize("kind", UNCHANGED)
def test_current_records_encode_to_the_v1_bytes(kind):
    """Kinds that did not change shape: today's encoding is byte-identical to what was stored."""
    assert current_version(type(pinned()[kind])) == 1
    assert encode(pinned()[kind]) == (V1 / f"{kind}.bin").read_bytes()


@pytest.mark.parametrize("kind", UNCHANGED)
def test_v1_bytes_decode(kind):
    assert decode((V1 / f"{kind}.bin").read_bytes()) == pinned()[kind]


def test_experience_is_v2_and_encodes_to_the_v2_bytes():
    assert current_version(Experience) == 2
    assert encode(pinned()["experience"]) == (V2 / "experience.bin").read_bytes()
    assert decode((V2 / "experience.bin").read_bytes()) == pinned()["experience"]


def test_v1_experience_gets_one_version_per_token():
    """The bytes of before the bump: every response token gets the record's policy_version (3)."""
    record = decode((V1 / "experience.bin").read_bytes())
    assert type(record) is Experience and record.schema_version == 2
    assert record.token_versions == [3, 3, 3] and record.policy_version == 3
    assert record.model_dump(exclude={"token_versions"}) == pinned()["experience"].model_dump(exclude={"token_versions"})
    assert msgpack.unpackb(encode(record))["schema_version"] == 2  # written back as v2


def test_the_archive_parquet_of_v1_is_upgraded_to_v2():
    records = from_arrow(pq.read_table(V1 / "experience.parquet"), Experience)
    assert [(r.experience_id, r.token_versions, r.schema_version) for r in records] == \
        [("e-1", [3, 3, 3], 2), ("e-2", [3, 3, 3], 2)]


def test_policy_version_is_the_oldest_token_version():
    fields = pinned()["experience"].model_dump()
    with pytest.raises(ValueError, match="oldest token version 3 != policy_version 4"):
        Experience(**{**fields, "policy_version": 4})
    with pytest.raises(ValueError, match="length 2 != response_tokens length 3"):
        Experience(**{**fields, "token_versions": [3, 3]})
    assert Experience(**{**fields, "token_versions": []}).versions() == [3, 3, 3]


@pytest.fixture
def experience_v3(monkeypatch):
    """Experience bumped to v3 for this test only (a `note` field), so that a v1 record climbs two
    upgraders. monkeypatch puts the real class and the upgrader registry back afterwards."""
    monkeypatch.delitem(base._REGISTRY, "experience")  # the real class comes back on undo
    monkeypatch.setattr("undertow.schemas.versions.UPGRADERS", dict(UPGRADERS))

    class ExperienceV3(Experience):
        kind: ClassVar[str] = "experience"
        schema_version: int = 3
        note: str = ""

    calls = []

    @upgrader("experience", 2)
    def note(fields: dict) -> dict:
        calls.append((fields["experience_id"], list(fields["token_versions"])))
        return {**fields, "note": "from v2"}

    return ExperienceV3, calls


def test_v1_experience_climbs_two_upgraders(experience_v3):
    experience_v3, calls = experience_v3
    record = decode((V1 / "experience.bin").read_bytes())
    assert type(record) is experience_v3 and record.schema_version == 3
    assert (record.token_versions, record.note) == ([3, 3, 3], "from v2")
    assert calls == [("e-1", [3, 3, 3])]  # v1 -> v2 ran first
    v2 = decode((V2 / "experience.bin").read_bytes())
    assert (v2.token_versions, v2.note) == ([3, 4, 3], "from v2")
    # A v3 record is written as v3 and read without the upgraders.
    again = decode(encode(record))
    assert again == record and len(calls) == 2
    assert msgpack.unpackb(encode(record))["schema_version"] == 3


def test_other_kinds_are_untouched_by_a_bump(experience_v3):
    assert decode((V1 / "task.bin").read_bytes()) == pinned()["task"]


def test_the_archive_parquet_of_v1_climbs_to_a_bumped_schema(experience_v3):
    records = from_arrow(pq.read_table(V1 / "experience.parquet"), experience_v3[0])
    assert [r.experience_id for r in records] == ["e-1", "e-2"]
    assert [(r.token_versions, r.note) for r in records] == [([3, 3, 3], "from v2")] * 2
    assert records[1].reward is None and records[0].reward == 1.0


def test_the_archive_through_sql_is_upgraded(experience_v3, tmp_path):
    """History's views read files with today's (v3) schema: the v1 file's missing columns are null."""
    from undertow.streams.history import History
    from undertow.streams.replay import Selection, select

    target = tmp_path / "ns" / "experiences.ready" / "experience" / "2023-11-14"
    target.mkdir(parents=True)
    name = "p000-000000000007-000000000008-1of1-experience.parquet"  # the archive's naming (archive_store.py)
    (target / name).write_bytes((V1 / "experience.parquet").read_bytes())
    records = select(History.from_archive(str(tmp_path)), Selection())
    assert [(r.experience_id, r.token_versions, r.schema_version) for r in records] == \
        [("e-1", [3, 3, 3], 3), ("e-2", [3, 3, 3], 3)]


def test_newer_than_the_reader_is_refused():
    """Bytes of a v3 experience (as a newer writer makes them) to today's v2 reader."""
    payload = msgpack.unpackb((V2 / "experience.bin").read_bytes())
    payload.update(schema_version=3, note="new")
    with pytest.raises(DecodeError) as caught:
        decode(msgpack.packb(payload, use_bin_type=True))
    error = caught.value
    assert (error.reason, error.kind, error.record_id) == ("schema_too_new", "experience", "e-1")
    assert error.detail == ("schema_version: experience v3 is newer than this reader's v2; "
                            "read it with the undertow that wrote it, or a newer one")


def test_newer_rows_of_the_archive_are_refused():
    table = pq.read_table(V1 / "experience.parquet")
    newer = table.set_column(table.column_names.index("schema_version"), "schema_version",
                             [[1, 3]])
    with pytest.raises(UpgradeError, match="schema_too_new: schema_version: experience v3 is newer"):
        from_arrow(newer, Experience)


def test_a_gap_in_the_upgraders_is_refused(monkeypatch):
    monkeypatch.delitem(base._REGISTRY, "experience")
    monkeypatch.setattr("undertow.schemas.versions.UPGRADERS", dict(UPGRADERS))

    class ExperienceV4(Experience):
        kind: ClassVar[str] = "experience"
        schema_version: int = 4

    upgrader("experience", 2)(lambda fields: fields)  # 1 -> 2 (the real one), 2 -> 3, but nothing from 3
    with pytest.raises(DecodeError) as caught:
        decode((V1 / "experience.bin").read_bytes())
    assert caught.value.reason == "schema_version"
    assert caught.value.detail == "schema_version: experience v3 has no upgrader to v4 (this reader is at v4)"


def test_an_upgrader_that_cannot_read_the_old_fields_is_invalid():
    payload = msgpack.unpackb((V1 / "experience.bin").read_bytes())
    del payload["policy_version"]
    with pytest.raises(DecodeError) as caught:
        decode(msgpack.packb(payload, use_bin_type=True))
    assert caught.value.reason == "invalid" and "upgrading experience v1 to v2: KeyError" in caught.value.detail


def test_one_upgrader_per_step(monkeypatch):
    monkeypatch.setattr("undertow.schemas.versions.UPGRADERS", dict(UPGRADERS))
    with pytest.raises(TypeError, match="already registered"):
        @upgrader("task", 99)
        def first(fields):
            return fields

        @upgrader("task", 99)
        def second(fields):
            return fields
