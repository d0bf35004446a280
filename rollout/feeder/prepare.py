"""Task pipelines: data-juicer operators over a taskset before training (`undertow prepare CONFIG`).

A prepare file names a taskset source (any feeder source: `{name: jsonl, path: …}`, `parquet`,
`hf_disk`, a generator), data-juicer ops in order (filters, mappers, deduplicators) and where the
prepared taskset goes (Parquet, which the feeder's `parquet` source reads back as it is):

    source: {name: jsonl, path: data/train.jsonl, fields: {prompt: question}}
    text: prompt                      # what the ops see: prompt (or, for chat tasks, the last user message) or answer
    ops:
      - {text_length_filter: {min_len: 10, max_len: 2000}}
      - {punctuation_normalization_mapper: {}}
      - {document_deduplicator: {lowercase: true}}
    difficulty:                       # optional, after the ops: each task's pass rate under a local model
      model: {name: smollm2-135m, source: gguf}
      rollout: {reward: numeric_match, sampling: {temperature: 1.0, max_new_tokens: 16}}
      samples: 8
      keep_between: [0.05, 0.95]      # drop what the model always or never solves
    out: data/train.prepared.parquet  # report: data/train.prepared.report.json unless `report` says

A run uses a prepare file as a taskset source, `{name: prepared, file: prepare.yaml}`: the first
command that reads it prepares it; later ones read `out` back while the report's fingerprint (the
prepare file's settings, the source file's size and time) still matches.

The report says, for each op, how many tasks came in and went out and which ones it dropped or
changed (their ids). Statistics the filters computed (`text_len`, …) are kept as columns `dj_<stat>`,
the difficulty scoring's pass rate as `model_pass_rate` (rollout/feeder/difficulty.py).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from undertow.kernel.datajuicer import check_entries, load_ops, op_kind
from undertow.rollout.feeder.difficulty import DifficultyConfig, pass_rates
from undertow.rollout.feeder.items import TaskItem, load_items

KEY, TEXT = "__undertow_key", "text"  # the columns the ops' dataset carries besides data-juicer's own


class PrepareConfig(BaseModel):
    """A prepare file: a taskset, the ops to run over it, and where the result goes."""

    model_config = ConfigDict(extra="forbid")

    source: str | dict[str, Any] = Field(description="a feeder taskset source: {name: jsonl, path: …} (rollout/feeder/)")
    ops: list[dict[str, dict[str, Any] | None]] = Field(default_factory=list,
        description="data-juicer ops in order, its own form: [{text_length_filter: {min_len: 5}}, …]")
    text: Literal["prompt", "answer"] = Field("prompt", description="the text the ops see and mappers rewrite")
    difficulty: DifficultyConfig | None = Field(None, description=(
        "after the ops, score each task's pass rate under a local model through undertow's engine"))
    out: str = Field(description="the prepared taskset, a Parquet file")
    report: str | None = Field(None, description="the report (JSON); default: <out without .parquet>.report.json")

    @field_validator("ops")
    @classmethod
    def _op_entries(cls, ops: list) -> list:
        return check_entries(ops, "ops")

    @field_validator("out")
    @classmethod
    def _parquet(cls, out: str) -> str:
        if not out.endswith(".parquet"):
            raise ValueError(f"expected a .parquet file, got {out!r}")
        return out

    def report_path(self) -> str:
        return self.report or self.out.removesuffix(".parquet") + ".report.json"


@dataclass
class OpReport:
    """What one op did: tasks in and out, and the ids it dropped or whose text it changed."""

    op: str
    kind: str
    tasks_in: int
    tasks_out: int
    dropped: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    seconds: float = 0.0


@dataclass
class PrepareReport:
    """The whole pipeline: the source, each op's report, and what was written."""

    source: Any
    tasks_in: int
    tasks_out: int
    ops: list[OpReport]
    out: str
    seconds: float
    fingerprint: str = ""

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, ensure_ascii=False)


def _text_of(item: TaskItem, text: str) -> str:
    if text == "answer":
        return item.answer or ""
    if item.prompt or not item.messages:
        return item.prompt
    users = [m for m in item.messages if m.get("role") == "user"]
    return users[-1]["content"] if users else ""


def _with_text(item: TaskItem, text: str, new: str) -> TaskItem:
    """`item` with the text the ops saw replaced by what a mapper made of it."""
    if text == "answer":
        return TaskItem(item.key, item.prompt, list(item.messages), new, dict(item.metadata))
    if item.prompt or not item.messages:
        return TaskItem(item.key, new, list(item.messages), item.answer, dict(item.metadata))
    last = max(i for i, m in enumerate(item.messages) if m.get("role") == "user")
    messages = [dict(m, content=new) if i == last else dict(m) for i, m in enumerate(item.messages)]
    return TaskItem(item.key, item.prompt, messages, item.answer, dict(item.metadata))


def run_ops(items: list[TaskItem], ops: list[dict[str, dict[str, Any]]], text: str) -> tuple[list[TaskItem], list[OpReport]]:
    """The items that survive the ops, in order (texts rewritten by mappers, filters' stats in
    metadata `dj_<stat>`), and what each op did."""
    from data_juicer.core.data import NestedDataset
    from data_juicer.utils.constant import Fields

    by_key = {item.key: item for item in items}
    if len(by_key) != len(items):
        raise ValueError("source: task ids repeat; give each row an id (fields: {id: …}) so the report can name them")
    dataset = NestedDataset.from_list([{KEY: item.key, TEXT: _text_of(item, text)} for item in items])
    reports = []
    for name, op in load_ops(ops):
        started, before = time.monotonic(), dict(zip(dataset[KEY], dataset[TEXT])) if len(dataset) else {}
        if before:
            dataset = op.run(dataset)
        after = dict(zip(dataset[KEY], dataset[TEXT])) if len(dataset) else {}
        reports.append(OpReport(name, op_kind(name), len(before), len(after),
                                dropped=[k for k in before if k not in after],
                                changed=[k for k, t in after.items() if k in before and before[k] != t],
                                seconds=round(time.monotonic() - started, 3)))
    rows = dataset.to_list() if len(dataset) else []
    out = []
    for row in rows:
        item = by_key[row[KEY]]
        if row[TEXT] != _text_of(item, text):
            item = _with_text(item, text, row[TEXT])
        stats = {f"dj_{k}": v for k, v in (row.get(Fields.stats) or {}).items() if v is not None}
        out.append(TaskItem(item.key, item.prompt, item.messages, item.answer, {**item.metadata, **stats}))
    return out, reports


def score_difficulty(items: list[TaskItem], cfg: DifficultyConfig) -> tuple[list[TaskItem], OpReport]:
    """The items with their pass rate in `metadata[cfg.column]`, those outside `keep_between` dropped."""
    started = time.monotonic()
    scored = [TaskItem(i.key, i.prompt, i.messages, i.answer, {**i.metadata, cfg.column: rate})
              for i, rate in zip(items, pass_rates(items, cfg))]
    low, high = cfg.keep_between or (0.0, 1.0)
    kept = [i for i in scored if low <= i.metadata[cfg.column] <= high]
    dropped = sorted({i.key for i in scored} - {i.key for i in kept})
    return kept, OpReport("difficulty", "model", len(items), len(kept), dropped=dropped,
                          seconds=round(time.monotonic() - started, 3))


def write_taskset(items: list[TaskItem], path: str) -> None:
    """Parquet the feeder's `parquet` source reads back: id, prompt, messages, answer, then metadata columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    columns: dict[str, Any] = {
        "id": pa.array([i.key for i in items], pa.string()),
        "prompt": pa.array([i.prompt for i in items], pa.string()),
        "messages": pa.array([i.messages for i in items], pa.list_(message)),
        "answer": pa.array([i.answer for i in items], pa.string()),
    }
    for name in dict.fromkeys(k for i in items for k in i.metadata):
        values = [i.metadata.get(name) for i in items]
        try:
            columns[name] = pa.array(values)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed types: as JSON text
            columns[name] = pa.array([None if v is None else json.dumps(v) for v in values], pa.string())
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path)


def fingerprint(cfg: PrepareConfig) -> str:
    """What the prepared taskset depends on: the settings, and the source file's size and time."""
    path = cfg.source.get("path") if isinstance(cfg.source, dict) else None
    stat = Path(path).stat() if path and Path(path).exists() else None
    made_of = [cfg.model_dump(mode="json"), [stat.st_size, stat.st_mtime_ns] if stat else None]
    return hashlib.sha256(json.dumps(made_of, sort_keys=True).encode()).hexdigest()[:16]


def load_prepare_config(path: Path) -> PrepareConfig:
    """A prepare file, validated (ConfigError naming the field)."""
    from pydantic import ValidationError

    from undertow.kernel.config_io import ConfigError, load_yaml, validation_message

    try:
        return PrepareConfig.model_validate(load_yaml(path))
    except ValidationError as e:
        raise ConfigError(validation_message(str(path), e, PrepareConfig)) from None


def prepared_items(path: Path) -> list[TaskItem]:
    """The items of a prepare file's taskset, prepared now unless `out` is still what it would make."""
    import pyarrow.parquet as pq

    cfg = load_prepare_config(path)
    report = Path(cfg.report_path())
    fresh = Path(cfg.out).exists() and report.exists() and \
        json.loads(report.read_text()).get("fingerprint") == fingerprint(cfg)
    if not fresh:
        prepare(cfg)
    columns = pq.read_schema(cfg.out).names
    return load_items({"name": "parquet", "path": cfg.out,
                       "keep": [c for c in columns if c not in {"id", "prompt", "messages", "answer"}]})


def prepare(cfg: PrepareConfig) -> PrepareReport:
    """Read the taskset, run the ops, write the prepared taskset and the report; returns the report."""
    started = time.monotonic()
    items = load_items(cfg.source)
    kept, reports = run_ops(items, cfg.ops, cfg.text) if cfg.ops else (items, [])
    if cfg.difficulty is not None:
        kept, scored = score_difficulty(kept, cfg.difficulty)
        reports.append(scored)
    write_taskset(kept, cfg.out)
    report = PrepareReport(cfg.source, len(items), len(kept), reports, cfg.out, round(time.monotonic() - started, 3),
                           fingerprint(cfg))
    Path(cfg.report_path()).parent.mkdir(parents=True, exist_ok=True)
    Path(cfg.report_path()).write_text(report.to_json())
    return report
