"""data-juicer, shared by the stream's `data_juicer` processor (experience text) and task pipelines
(`undertow prepare`, tasksets before training): ops loaded so that nothing is installed at run time,
and what kind each op is.

An op entry is data-juicer's own form, `{op_name: {arg: value}}`. Ops run in this process
(`num_proc: 1` unless an entry says otherwise): data-juicer's default forks a pool per op.
The rule-based text ops run offline; the stopword / flagged-word filters download word lists, language
id and perplexity need models, and the simhash / minhash deduplicators need simhash-pybind / scipy.
"""

from __future__ import annotations

import os
from typing import Any, Literal, Mapping

OpKind = Literal["filter", "mapper", "deduplicator", "other"]


def check_entries(ops: object, where: str) -> list[dict[str, dict[str, Any]]]:
    """`ops` as a list of one-key mappings, else ValueError naming `where`."""
    if not isinstance(ops, list) or not ops or not all(isinstance(op, Mapping) and len(op) == 1 for op in ops):
        raise ValueError(f"{where}: expected a list like [{{text_length_filter: {{min_len: 5}}}}], got {ops!r}")
    return [{name: dict(args or {})} for op in ops for name, args in op.items()]


def _import_ops() -> Any:
    # data-juicer may pip/uv-install missing packages at run time; make that fail instead.
    os.environ.setdefault("UV_OFFLINE", "1")
    os.environ.setdefault("PIP_NO_INDEX", "1")
    try:
        import data_juicer.ops as ops
    except ImportError as e:
        raise RuntimeError(f"data_juicer: data-juicer is not importable ({e}); install py-data-juicer "
                           "(pyproject.toml's extra `datajuicer`, infra/requirements-nodeps.txt)") from None
    return ops


def load_ops(entries: list[dict[str, dict[str, Any]]]) -> list[tuple[str, Any]]:
    """(name, op) for each entry, built by data-juicer, in this process."""
    ops = _import_ops()
    unknown = [name for entry in entries for name in entry if name not in ops.OPERATORS.modules]
    if unknown:
        raise ValueError(f"data_juicer: unknown op(s) {unknown}; data-juicer {len(ops.OPERATORS.modules)} ops "
                         f"include e.g. text_length_filter, document_deduplicator, whitespace_normalization_mapper")
    built = ops.load_ops([{name: {"num_proc": 1, **args}} for entry in entries for name, args in entry.items()])
    return [(next(iter(entry)), op) for entry, op in zip(entries, built)]


def op_kind(name: str) -> OpKind:
    """What op `name` does to a dataset: drops rows (filter, deduplicator) or rewrites them (mapper)."""
    ops = _import_ops()
    from data_juicer.ops.base_op import Deduplicator, Filter, Mapper

    cls = ops.OPERATORS.modules.get(name)
    for base, kind in ((Filter, "filter"), (Mapper, "mapper"), (Deduplicator, "deduplicator")):
        if isinstance(cls, type) and issubclass(cls, base):
            return kind  # type: ignore[return-value]
    return "other"
