"""Taskset sources on local files: JSONL, Parquet, and directories written by `datasets.save_to_disk`.

Field mapping: `fields` maps a Task field (`prompt`, `answer`, `messages`, `id`) to a column;
`prompt_template` (e.g. "{question}\\nAnswer:") builds the prompt from several columns instead;
`answer_after` keeps only the text after a marker (GSM8K's "####"); `keep` copies columns into
the task's metadata (Countdown needs `numbers` and `target` there).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from undertow.rollout.feeder.items import TaskItem, source

TASK_FIELDS = {"prompt", "answer", "messages", "id"}


def rows_to_items(rows: Iterable[dict[str, Any]], origin: str, fields: dict[str, str] | None,
                  prompt_template: str | None, answer_after: str | None, keep: list[str]) -> list[TaskItem]:
    fields = {"prompt": "prompt", "answer": "answer", "messages": "messages", "id": "id", **(fields or {})}
    unknown = sorted(set(fields) - TASK_FIELDS)
    if unknown:
        raise ValueError(f"fields: unknown task field(s) {unknown}; expected some of {sorted(TASK_FIELDS)}")
    items = []
    for n, row in enumerate(rows):
        where = f"{origin} row {n}"
        prompt = _prompt(row, fields["prompt"], prompt_template, where)
        messages = row.get(fields["messages"]) or []
        if not prompt and not messages:
            raise ValueError(f"{where}: no prompt (column {fields['prompt']!r}) and no messages")
        answer = row.get(fields["answer"])
        if answer is not None:
            answer = str(answer)
            if answer_after and answer_after in answer:
                answer = answer.rsplit(answer_after, 1)[1].strip()
        missing = [k for k in keep if k not in row]
        if missing:
            raise ValueError(f"{where}: keep names missing column(s) {missing}")
        key = str(row.get(fields["id"], n))
        items.append(TaskItem(key=key, prompt=prompt, messages=list(messages), answer=answer,
                              metadata={k: _jsonable(row[k]) for k in keep}))
    return items


def _prompt(row: dict[str, Any], column: str, template: str | None, where: str) -> str:
    if template is None:
        return str(row.get(column) or "")
    try:
        return template.format(**row)
    except KeyError as e:
        raise ValueError(f"{where}: prompt_template names missing column {e}") from None


def _jsonable(value: Any) -> Any:
    """Arrow / numpy values as plain JSON values."""
    return value.tolist() if hasattr(value, "tolist") else value


@source("jsonl")
def jsonl(*, path: str, fields: dict[str, str] | None = None, prompt_template: str | None = None,
          answer_after: str | None = None, keep: list[str] = []) -> list[TaskItem]:
    """One task per line of a JSON Lines file."""
    rows = []
    for n, line in enumerate(Path(path).read_text().splitlines()):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path} line {n + 1}: not JSON: {e.msg}") from None
    return rows_to_items(rows, path, fields, prompt_template, answer_after, keep)


@source("parquet")
def parquet(*, path: str, fields: dict[str, str] | None = None, prompt_template: str | None = None,
            answer_after: str | None = None, keep: list[str] = []) -> list[TaskItem]:
    """One task per row of a Parquet file (or a directory of them)."""
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    return rows_to_items(rows, path, fields, prompt_template, answer_after, keep)


@source("prepared")
def prepared(*, file: str) -> list[TaskItem]:
    """The taskset a prepare file makes (`undertow prepare`, rollout/feeder/prepare.py): prepared by the
    first command that reads it, then read back while the prepare file and its source are unchanged."""
    from undertow.rollout.feeder.prepare import prepared_items

    return prepared_items(Path(file))


@source("hf_disk")
def hf_disk(*, path: str, split: str | None = None, fields: dict[str, str] | None = None,
            prompt_template: str | None = None, answer_after: str | None = None,
            keep: list[str] = []) -> list[TaskItem]:
    """A local directory from `Dataset.save_to_disk` / `DatasetDict.save_to_disk` (choose `split`).

    Uses `datasets.load_from_disk` when the `datasets` package is installed; otherwise reads the
    same files with pyarrow (`state.json` lists the Arrow stream files of a split).
    """
    root = Path(path)
    if (root / "dataset_dict.json").exists():
        splits = json.loads((root / "dataset_dict.json").read_text())["splits"]
        if split not in splits:
            raise ValueError(f"split: {path} holds splits {splits}, got {split!r}")
        root = root / split
    if not (root / "state.json").exists():
        raise ValueError(f"path: {path} is not a datasets.save_to_disk directory (no state.json)")
    return rows_to_items(_arrow_rows(root), str(root), fields, prompt_template, answer_after, keep)


def _arrow_rows(directory: Path) -> list[dict[str, Any]]:
    try:
        from datasets import load_from_disk
    except ImportError:
        import pyarrow as pa

        state = json.loads((directory / "state.json").read_text())
        tables = [pa.ipc.open_stream(pa.memory_map(str(directory / f["filename"]))).read_all()
                  for f in state["_data_files"]]
        return pa.concat_tables(tables).to_pylist() if tables else []
    return list(load_from_disk(str(directory)))
