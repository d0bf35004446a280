"""`data_juicer`: data-juicer text operators applied to the response text.

ops: data-juicer's own op list, `[{op_name: {arg: value}}, …]` (e.g. `{text_length_filter: {min_len: 5}}`).
A filter that fails rejects the record (reason "data_juicer", detail names the op); a mapper
rewrites `response_text`. The trainer learns from tokens, so a mapper is refused for RL objectives
when the config loads (infra/run/rules.py: the behaviour log-probs are of the tokens as generated);
the offline objectives (sft, dpo, ...) may use one, with `tokenizer` (a model spec, the run's `model`
section) to re-tokenize what it rewrote: the per-token lists of the old tokens are then cleared.
Tasksets are cleaned before training with the same ops by `undertow prepare` (rollout/feeder/prepare.py).
"""

from __future__ import annotations

from typing import Any, Mapping

from undertow.kernel.datajuicer import check_entries, load_ops, op_kind
from undertow.schemas import Experience
from undertow.processors.api import Reject, processor

TEXT_KEY = "text"


@processor("data_juicer")
class DataJuicer:
    """Runs the ops in order on a batch of response texts with data-juicer's batched op API."""

    def __init__(self, *, ops: list[Mapping[str, Any]], tokenizer: Mapping[str, Any] | None = None):
        loaded = load_ops(check_entries(ops, "data_juicer.ops"))
        self.names = [name for name, _ in loaded]
        self.ops = [op for _, op in loaded]
        self.tokenizer = None
        self.now_running: str | None = None  # the op at work: a timeout's detail names it (pipeline.py)
        if tokenizer is not None:
            from undertow.kernel.models import ModelSpec, build_tokenizer

            self.tokenizer = build_tokenizer(ModelSpec.model_validate(dict(tokenizer)))

    @staticmethod
    def text_mappers(*, ops: list[Mapping[str, Any]]) -> list[str]:
        """The ops of `ops` that rewrite the text (the config's rules refuse them for RL objectives)."""
        return [name for entry in check_entries(ops, "data_juicer.ops") for name in entry if op_kind(name) == "mapper"]

    def process_batch(self, exps: list[Experience]) -> list[Experience | Reject]:
        from data_juicer.ops.base_op import Filter, Mapper
        from data_juicer.utils.constant import Fields

        verdicts: list[Reject | None] = [None] * len(exps)
        alive = list(range(len(exps)))  # indices still in the batch
        texts = [e.response_text for e in exps]
        for name, op in zip(self.names, self.ops):
            if not alive:
                break
            self.now_running = f"data-juicer op {name!r}"
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
        self.now_running = None
        return [verdict or self._rewritten(exp, text) for exp, verdict, text in zip(exps, verdicts, texts)]

    def _rewritten(self, exp: Experience, text: str) -> Experience:
        """`exp` with a mapper's text; re-tokenized when a tokenizer is set (offline objectives)."""
        if text == exp.response_text:
            return exp
        if self.tokenizer is None:
            return exp.model_copy(update={"response_text": text})
        tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        eos = self.tokenizer.eos_token_id
        if exp.response_tokens and exp.response_tokens[-1] == eos:
            tokens.append(eos)  # it ended as generated; the mapper saw text only
        # Log-probs, mask and advantages described the generated tokens, not these.
        return exp.model_copy(update={"response_text": text, "response_tokens": tokens, "behaviour_logprobs": [],
                                      "loss_mask": [], "advantages": [],
                                      "metadata": {**exp.metadata, "retokenized_by": "data_juicer"}})
