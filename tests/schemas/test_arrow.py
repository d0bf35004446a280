"""Arrow tables: every field gets a typed column, and tables turn back into equal records."""

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from undertow.schemas import (
    Experience,
    MetricEvent,
    Record,
    Task,
    WeightUpdate,
    arrow_schema,
    from_arrow,
    record_types,
    to_arrow,
)

KINDS = sorted(record_types())


@pytest.mark.parametrize("kind", KINDS)
def test_round_trip(examples, kind):
    record = examples[kind]
    table = to_arrow([record, record])
    assert table.num_rows == 2
    assert table.schema.equals(arrow_schema(type(record)))
    assert from_arrow(table, type(record)) == [record, record]


@pytest.mark.parametrize("kind", KINDS)
def test_every_field_has_a_column(kind):
    cls = record_types()[kind]
    schema = arrow_schema(cls)
    assert schema.names == list(cls.model_fields)
    assert schema.metadata[b"undertow.kind"] == kind.encode()


def test_through_parquet(examples, tmp_path):
    exp = examples["experience"]
    unscored = exp.model_copy(update={"experience_id": "e-2", "reward": None, "metadata": {}})
    pq.write_table(to_arrow([exp, unscored]), tmp_path / "exp.parquet")
    assert from_arrow(pq.read_table(tmp_path / "exp.parquet"), Experience) == [exp, unscored]


def test_column_types():
    exp = arrow_schema(Experience)
    assert exp.field("response_tokens").type == pa.list_(pa.int32())
    assert exp.field("behaviour_logprobs").type == pa.list_(pa.float32())
    assert exp.field("metadata").type == pa.string()
    assert exp.field("finish_reason").type == pa.string()
    assert exp.field("reward").type == pa.float64() and exp.field("reward").nullable
    assert not exp.field("policy_version").nullable and exp.field("policy_version").type == pa.int64()
    assert exp.field("reward_components").type == pa.map_(pa.string(), pa.float64())
    assert arrow_schema(Task).field("messages").type == pa.string()
    assert arrow_schema(MetricEvent).field("labels").type == pa.map_(pa.string(), pa.string())
    assert arrow_schema(WeightUpdate).field("data").type == pa.binary()


def test_json_columns_hold_json(examples):
    table = to_arrow([examples["task"]])
    assert table.column("messages").to_pylist() == ['[{"role":"user","content":"What is 2+2?"}]']


def test_unknown_type_is_an_error_not_a_dropped_column():
    class Odd(Record):
        name: str = ""
        tags: set[str] = set()

    with pytest.raises(TypeError, match=r"Odd\.tags"):
        arrow_schema(Odd)
    with pytest.raises(TypeError, match=r"Odd\.tags"):
        to_arrow([Odd()])


def test_one_class_per_table(examples):
    with pytest.raises(ValueError, match="exactly one class"):
        to_arrow([examples["task"], examples["experience"]])
    with pytest.raises(ValueError, match="exactly one class"):
        to_arrow([])
    empty = to_arrow([], cls=Task)
    assert empty.num_rows == 0 and empty.schema.equals(arrow_schema(Task))
    assert from_arrow(empty, Task) == []
