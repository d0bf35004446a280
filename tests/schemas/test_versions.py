"""Schema evolution: version-1 bytes (stored on 2026-12-03) decode today and after a test-only bump of
Experience to v2, through its upgrader, on the wire and from the archive's Parquet; newer is refused."""

from pathlib import Path
from typing import Annotated, ClassVar

import msgpack
import pyarrow.parquet as pq
import pytest
from pydantic import Field

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
from undertow.schemas.base import Packed
from tests.record_examples import T0, make_examples

V1 = Path(__file__).parents[1] / "fixtures" / "schemas" / "v1"
KINDS = sorted(record_types())


def pinned() -> dict:
    """The examples exactly as the fixtures were written (the weight update's created_at is time.time())."""
    examples = make_examples()
    examples["weight_update"] = examples["weight_update"].model_copy(update={"created_at": T0})
    return examples


def test_a_fixture_for_every_kind():
    assert sorted(p.stem for p in V1.glob("*.bin")) == KINDS


@pytest.mark.parametrize("kind", KINDS)
def test_current_records_encode_to_the_v1_bytes(kind):
    """No kind changed shape yet: today's encoding is byte-identical to what was stored."""
    assert current_version(type(pinned()[kind])) == 1
    assert encode(pinned()[kind]) == (V1 / f"{kind}.bin").read_bytes()


@pytest.mark.parametrize("kind", KINDS)
def test_v1_bytes_decode(kind):
    assert decode((V1 / f"{kind}.bin").read_bytes()) == pinned()[kind]


TokenVersions = Annotated[list[Annotated[int, Field(ge=0)]], Packed("<i4")]


@pytest.fixture
def experience_v2(monkeypatch):
    """Experience bumped to v2 for this test only: one policy version per response token, filled in
    for v1 records by an upgrader (what a per-token behaviour version would look like). monkeypatch
    puts the real class and the upgrader registry back afterwards."""
    monkeypatch.delitem(base._REGISTRY, "experience")  # the real class comes back on undo
    monkeypatch.setattr("undertow.schemas.versions.UPGRADERS", dict(UPGRADERS))

    class ExperienceV2(Experience):
        kind: ClassVar[str] = "experience"
        schema_version: int = 2
        token_versions: TokenVersions = []

    calls = []

    @upgrader("experience", 1)
    def token_versions(fields: dict) -> dict:
        calls.append(fields["experience_id"])
        # v1 had one version for the whole response; the archive's v2 view reads the column as null
        n = len(fields.get("response_tokens") or [])
        return {**fields, "token_versions": [fields["policy_version"]] * n}

    return ExperienceV2, calls


def test_v1_experience_is_upgraded_to_a_bumped_schema(experience_v2):
    experience_v2, calls = experience_v2
    record = decode((V1 / "experience.bin").read_bytes())
    assert type(record) is experience_v2 and record.schema_version == 2
    assert record.token_versions == [3, 3, 3]  # the fixture's policy_version 3, once per response token
    assert record.model_dump(exclude={"schema_version", "token_versions"}) == \
        pinned()["experience"].model_dump(exclude={"schema_version"})
    assert calls == ["e-1"]
    # A v2 record is written as v2 and read without the upgrader.
    again = decode(encode(record))
    assert again == record and calls == ["e-1"]
    assert msgpack.unpackb(encode(record))["schema_version"] == 2


def test_other_kinds_are_untouched_by_a_bump(experience_v2):
    assert decode((V1 / "task.bin").read_bytes()) == pinned()["task"]


def test_the_archive_parquet_of_v1_is_upgraded(experience_v2):
    records = from_arrow(pq.read_table(V1 / "experience.parquet"), experience_v2[0])
    assert [r.experience_id for r in records] == ["e-1", "e-2"]
    assert [r.token_versions for r in records] == [[3, 3, 3], [3, 3, 3]]
    assert records[1].reward is None and records[0].reward == 1.0


def test_the_archive_through_sql_is_upgraded(experience_v2, tmp_path):
    """History's views read files with today's (v2) schema: the v1 file's missing column is null."""
    from undertow.streams.history import History
    from undertow.streams.replay import Selection, select

    target = tmp_path / "ns" / "experiences.ready" / "experience" / "2023-11-14"
    target.mkdir(parents=True)
    name = "p000-000000000007-000000000008-1of1-experience.parquet"  # the archive's naming (archive_store.py)
    (target / name).write_bytes((V1 / "experience.parquet").read_bytes())
    records = select(History.from_archive(str(tmp_path)), Selection())
    assert [(r.experience_id, r.token_versions, r.schema_version) for r in records] == \
        [("e-1", [3, 3, 3], 2), ("e-2", [3, 3, 3], 2)]


def test_newer_than_the_reader_is_refused():
    """Bytes of a v2 experience (as a newer writer makes them) to today's v1 reader."""
    payload = msgpack.unpackb((V1 / "experience.bin").read_bytes())
    payload.update(schema_version=2, token_versions=b"\x03\x00\x00\x00" * 3)
    with pytest.raises(DecodeError) as caught:
        decode(msgpack.packb(payload, use_bin_type=True))
    error = caught.value
    assert (error.reason, error.kind, error.record_id) == ("schema_too_new", "experience", "e-1")
    assert error.detail == ("schema_version: experience v2 is newer than this reader's v1; "
                            "read it with the undertow that wrote it, or a newer one")


def test_newer_rows_of_the_archive_are_refused():
    table = pq.read_table(V1 / "experience.parquet")
    newer = table.set_column(table.column_names.index("schema_version"), "schema_version",
                             [[1, 2]])
    with pytest.raises(UpgradeError, match="schema_too_new: schema_version: experience v2 is newer"):
        from_arrow(newer, Experience)


def test_a_gap_in_the_upgraders_is_refused(monkeypatch):
    monkeypatch.delitem(base._REGISTRY, "experience")
    monkeypatch.setattr("undertow.schemas.versions.UPGRADERS", dict(UPGRADERS))

    class ExperienceV3(Experience):
        kind: ClassVar[str] = "experience"
        schema_version: int = 3

    upgrader("experience", 1)(lambda fields: fields)  # 1 -> 2, but nothing from 2
    with pytest.raises(DecodeError) as caught:
        decode((V1 / "experience.bin").read_bytes())
    assert caught.value.reason == "schema_version"
    assert caught.value.detail == "schema_version: experience v2 has no upgrader to v3 (this reader is at v3)"


def test_an_upgrader_that_cannot_read_the_old_fields_is_invalid(experience_v2):
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
