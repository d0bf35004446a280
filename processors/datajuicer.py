"""`data_juicer`: data-juicer text operators applied to the response text.

ops: data-juicer's own op list, `[{op_name: {arg: value}}, …]` (e.g. `{text_length_filter: {min_len: 5}}`).
A filter that fails rejects the record (reason "data_juicer", detail names the op); a mapper
rewrites `response_text` (tokens are left as generated: the trainer learns from tokens).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from undertow.schemas import Experience
from undertow.processors.api import Reject, processor

TEXT_KEY = "text"


def _load_ops(ops: list[Mapping[str, Any]]) -> list[Any]:
    # data-juicer may pip/uv-install missing packages at run time; refuse that (see README).
    os.environ.setdefault("UV_OFFLINE", "1")
    os.environ.setdefault("PIP_NO_INDEX", "1")
    try:
        from data_juicer.ops import load_ops
    except ImportError as e:
        raise RuntimeError(f"data_juicer: data-juicer is not importable ({e}); install py-data-juicer "
                           "(see processors/datajuicer.py and the README)") from None
    return load_ops([dict(op) for op in ops])


@processor("data_juicer")
class DataJuicer:
    """Runs the ops in order on a batch of response texts with data-juicer's batched op API."""

    def __init__(self, *, ops: list[Mapping[str, Any]]):
        if not ops or not all(isinstance(op, Mapping) and len(op) == 1 for op in ops):
            raise ValueError(f"data_juicer.ops: expected a list like [{{text_length_filter: {{min_len: 5}}}}], got {ops!r}")
        self.ops = _load_ops(ops)
        self.names = [next(iter(op)) for op in ops]

    def process_batch(self, exps: list[Experience]) -> list[Experience | Reject]:
        from data_juicer.ops.base_op import Filter, Mapper
        from data_juicer.utils.constant import Fields

        verdicts: list[Reject | None] = [None] * len(exps)
        alive = list(range(len(exps)))  # indices still in the batch
        texts = [e.response_text for e in exps]
        for name, op in zip(self.names, self.ops):
            if not alive:
                break
            samples = {TEXT_KEY: [texts[i] for i in alive], Fields.stats: [{} for _ in alive]}
            if isinstance(op, Filter):
                samples = op.compute_stats_batched(samples)
                keep = list(op.process_batched(samples))
                for i, kept, stats in zip(alive, keep, samples[Fields.stats]):
                    if not kept:
                        verdicts[i] = Reject("data_juicer", f"{name} filtered it out (stats {dict(stats)})")
                alive = [i for i, kept in zip(alive, keep) if kept]
            elif isinstance(op, Mapper):
                rewritten = op.process_batched(samples)[TEXT_KEY]
                if len(rewritten) != len(alive):
                    raise RuntimeError(f"data_juicer op {name}: turned {len(alive)} texts into {len(rewritten)}")
                for i, text in zip(alive, rewritten):
                    texts[i] = text
            else:
                raise RuntimeError(f"data_juicer op {name}: only filters and mappers apply to single records")
        return [verdict or (exp if text == exp.response_text else exp.model_copy(update={"response_text": text}))
                for exp, verdict, text in zip(exps, verdicts, texts)]
