"""Wire codec: round trips, size, and every decode check with the reason and field it reports."""

import json
import math

import msgpack
import numpy as np
import pytest

from undertow.schemas import (
    MAX_TOKENS,
    SCHEMA_VERSION,
    DecodeError,
    Experience,
    current_version,
    Record,
    Task,
    decode,
    encode,
    record_types,
)

KINDS = sorted(record_types())


def wire(record: Record) -> dict:
    """The decoded msgpack map of a valid record, to spoil by hand."""
    return msgpack.unpackb(encode(record), raw=False)


def pack(payload: object) -> bytes:
    return msgpack.packb(payload, use_bin_type=True)


def i32(values: list[int]) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def f32(values: list[float]) -> bytes:
    return np.asarray(values, dtype="<f4").tobytes()


def u8(values: list[int]) -> bytes:
    return np.asarray(values, dtype="<u1").tobytes()


def decode_error(data: bytes, **kwargs: object) -> DecodeError:
    with pytest.raises(DecodeError) as caught:
        decode(data, **kwargs)
    return caught.value


def test_examples_cover_every_kind(examples):
    assert sorted(examples) == KINDS == sorted(
        ["task", "experience", "preference_pair", "weight_update", "metric", "task_stat", "rejected", "eval"]
    )
    assert all(record.kind == kind for kind, record in examples.items())


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip(examples, kind):
    record = examples[kind]
    back = decode(encode(record), expect=type(record))
    assert type(back) is type(record)
    assert back == record


def test_wire_is_a_map_with_kind_and_packed_arrays(examples):
    payload = wire(examples["experience"])
    assert payload["kind"] == "experience"
    assert payload["schema_version"] == 2  # experience v2: per-token behaviour versions
    assert payload["token_versions"] == i32([3, 4, 3])
    assert payload["response_tokens"] == i32([1018, 102, 7])
    assert payload["loss_mask"] == u8([1, 0, 1])
    assert payload["behaviour_logprobs"] == f32([-0.5, -0.25, -1.5])
    assert payload["timestamps"]["generated"] == 1_700_000_001.25  # float64 kept: not fp32-exact


def test_float_arrays_are_fp32_on_the_wire(examples):
    exp = examples["experience"].model_copy(update={"advantages": [0.1, -1 / 3, 2.0]})
    back = decode(encode(exp))
    assert back.advantages == [float(np.float32(0.1)), float(np.float32(-1 / 3)), 2.0]
    assert back.advantages != exp.advantages  # 0.1 is not fp32-representable
    assert back.advantages == pytest.approx(exp.advantages, rel=1e-7)


def test_experience_with_1000_tokens_is_compact(examples):
    n = 1000
    exp = examples["experience"].model_copy(
        update={
            "response_tokens": [30_000 + i for i in range(n)],
            "behaviour_logprobs": [-(i % 97) / 64 for i in range(n)],  # fp32-exact
            "loss_mask": [i % 2 for i in range(n)],
            "advantages": [],
            "token_versions": [],  # empty: every token of policy_version (a per-token list adds 4 B/token)
        }
    )
    data = encode(exp)
    assert len(data) < 12_000  # 4 B/token id + 4 B/log-prob + 1 B/mask + a few hundred
    assert len(data) < len(exp.model_dump_json())
    assert decode(data) == exp


def test_decode_accepts_a_tuple_of_expected_kinds(examples):
    assert decode(encode(examples["task"]), expect=(Experience, Task)) == examples["task"]


def test_unexpected_kind(examples):
    error = decode_error(encode(examples["task"]), expect=Experience)
    assert error.reason == "unexpected_kind"
    assert "'task'" in error.detail and "experience" in error.detail


# case -> (fields to change in a valid experience's wire map; None deletes), expected detail part
INVALID_EXPERIENCES = {
    "logprob_length": (
        {"behaviour_logprobs": f32([-0.5, -0.25])},
        "behaviour_logprobs: length 2 != response_tokens length 3",
    ),
    "mask_length": ({"loss_mask": u8([1, 1])}, "loss_mask: length 2 != response_tokens length 3"),
    "advantage_length": ({"advantages": f32([1.0])}, "advantages: length 1 != response_tokens length 3"),
    "mask_value_2": ({"loss_mask": u8([1, 2, 1])}, "loss_mask.1: Input should be less than or equal to 1"),
    "positive_logprob": ({"behaviour_logprobs": f32([-0.5, 0.5, -1.0])}, "behaviour_logprobs.1:"),
    "nan_logprob": (
        {"behaviour_logprobs": f32([-0.5, math.nan, -1.0])},
        "behaviour_logprobs.1: Input should be a finite number",
    ),
    "nan_reward": ({"reward": math.nan}, "reward: Input should be a finite number"),
    "inf_component": (
        {"reward_components": {"correct": math.inf}},
        "reward_components.correct: Input should be a finite number",
    ),
    "sample_index": ({"sample_index": 4}, "sample_index: 4 >= group_size 4"),
    "negative_token": (
        {"response_tokens": i32([5, -1, 7])},
        "response_tokens.1: Input should be greater than or equal to 0",
    ),
    "too_many_tokens": (
        {"response_tokens": bytes(4 * (MAX_TOKENS + 1))},
        f"response_tokens: {MAX_TOKENS + 1} items > max {MAX_TOKENS}",
    ),
    "misaligned_array": ({"response_tokens": b"\x00" * 5}, "response_tokens: 5 bytes is not a multiple of 4"),
    "array_as_list": ({"prompt_tokens": [1, 2]}, "prompt_tokens: expected packed <i4 bytes, got list"),
    "finish_reason": ({"finish_reason": "done"}, "finish_reason: Input should be 'stop', 'length' or 'abort'"),
    "negative_priority": ({"priority": -1.0}, "priority: Input should be greater than or equal to 0"),
    "empty_id": ({"experience_id": ""}, "experience_id: String should have at least 1 character"),
    "extra_field": ({"surprise": 1}, "surprise: Extra inputs are not permitted"),
    "missing_field": ({"policy_version": None}, "policy_version: Field required"),
}


@pytest.mark.parametrize("case", sorted(INVALID_EXPERIENCES))
def test_invalid_experience(examples, case):
    changes, expected = INVALID_EXPERIENCES[case]
    payload = wire(examples["experience"])
    for name, value in changes.items():
        if value is None:
            del payload[name]
        else:
            payload[name] = value
    error = decode_error(pack(payload))
    assert error.reason == "invalid"
    assert expected in error.detail
    # Enough to key the Rejected record; an empty id is no id.
    assert error.kind == "experience" and error.record_id == (payload.get("experience_id") or None)


def test_detail_lists_each_error(examples):
    payload = wire(examples["experience"])
    payload["reward"] = math.inf
    payload["sample_index"] = 9
    error = decode_error(pack(payload))
    assert error.detail == "sample_index: 9 >= group_size 4; reward: Input should be a finite number"


def test_same_rules_apply_when_building_records(examples):
    with pytest.raises(ValueError, match="behaviour_logprobs"):
        Experience(**{**examples["experience"].model_dump(), "behaviour_logprobs": [-1.0]})


def test_task_needs_prompt_or_messages(examples):
    payload = wire(examples["task"])
    payload["prompt"], payload["messages"] = "", []
    error = decode_error(pack(payload))
    assert error.reason == "invalid" and error.detail.startswith("messages: empty, and prompt is empty")
    payload["messages"] = [{"content": "hi"}]
    assert "messages: message 0 lacks 'role'" in decode_error(pack(payload)).detail


@pytest.mark.parametrize("version", [0, -1, "1", True, None])
def test_wrong_schema_version(examples, version):
    payload = wire(examples["experience"])
    if version is None:
        del payload["schema_version"]
    else:
        payload["schema_version"] = version
    error = decode_error(pack(payload))
    assert error.reason == "schema_version"
    assert error.detail == f"schema_version: expected 1 to {current_version(Experience)}, got {version!r}"


def test_newer_schema_version_is_too_new(examples):
    """Older versions are upgraded (tests/schemas/test_versions.py); a newer one cannot be read."""
    payload = wire(examples["experience"])
    payload["schema_version"] = current_version(Experience) + 1
    error = decode_error(pack(payload))
    assert (error.reason, error.record_id) == ("schema_too_new", "e-1")
    assert error.detail.startswith("schema_version: experience v3 is newer than this reader's v2")


def test_unknown_kind(examples):
    payload = wire(examples["experience"])
    payload["kind"] = "experiance"
    error = decode_error(pack(payload))
    assert error.reason == "unknown_kind" and "'experiance'" in error.detail


@pytest.mark.parametrize(
    "data",
    [
        b"\xc1\xff\x00",  # 0xc1 is never valid msgpack
        b"",
        pack({"kind": "task"})[:-2],  # cut short
        pack({1: "int keys are refused"}),
        pack({"kind": "task", "x": "\u00e9"}).replace("\u00e9".encode(), b"\xff\xfe"),  # bad UTF-8
        msgpack.packb(msgpack.ExtType(5, b"abc")),
    ],
    ids=["reserved_byte", "empty", "truncated", "int_key", "bad_utf8", "ext_type"],
)
def test_undecodable(data):
    assert decode_error(data).reason == "undecodable"


@pytest.mark.parametrize("payload", [[1, 2, 3], "experience", 7, {"no": "kind"}, {"kind": 5}])
def test_not_a_record_envelope(payload):
    error = decode_error(pack(payload))
    assert error.reason == "undecodable"


def test_too_large_is_refused_before_parsing(examples):
    data = encode(examples["experience"])
    assert decode(data, max_bytes=len(data)) == examples["experience"]
    error = decode_error(data, max_bytes=len(data) - 1)
    assert error.reason == "too_large" and str(len(data)) in error.detail


def test_too_large_reason_wins_over_garbage():
    assert decode_error(b"\xc1" * 100, max_bytes=10).reason == "too_large"


def test_decode_error_is_a_value_error_with_reason_in_message(examples):
    error = decode_error(pack([1]))
    assert isinstance(error, ValueError)
    assert str(error).startswith("undecodable: ")


def test_encode_refuses_unregistered_records():
    class Scratch(Record):  # no kind: not registered
        x: int = 0

    with pytest.raises(TypeError, match="Scratch"):
        encode(Scratch())


def test_a_kind_cannot_be_registered_twice():
    with pytest.raises(TypeError, match="already registered"):

        class Impostor(Record):
            kind = "task"

    assert record_types()["task"] is Task


def test_no_pickle_in_schemas():
    import pathlib

    import undertow.schemas as schemas

    for path in pathlib.Path(schemas.__file__).parent.glob("*.py"):
        assert "pickle" not in path.read_text(), path


def test_json_metadata_round_trips_exactly(examples):
    exp = examples["experience"]
    assert json.dumps(decode(encode(exp)).metadata) == json.dumps(exp.metadata)
