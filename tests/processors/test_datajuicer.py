"""data-juicer text ops applied to responses: filters drop, mappers rewrite."""

import data_juicer.ops  # noqa: F401  CI installs it (infra/requirements-nodeps.txt): missing fails, not skips
import pytest

from undertow.processors import Harness
from tests.helpers import exp


def test_filters_drop_and_mappers_rewrite():
    h = Harness([{"name": "data_juicer", "ops": [
        {"text_length_filter": {"min_len": 5, "max_len": 100}},
        {"whitespace_normalization_mapper": {}},
        {"punctuation_normalization_mapper": {}},
    ]}])
    h.feed([exp("a", 0, 1, text="hi"), exp("b", 0, 1, text="hello\u3000world\uff0cok")])
    assert [e.response_text for e in h.ready] == ["hello world,ok"]
    assert h.reasons() == [("data_juicer", "data_juicer")]
    assert "text_length_filter" in h.out.dropped[0].detail


def test_a_list_that_is_not_ops_is_refused():
    with pytest.raises(ValueError, match=r"'data_juicer': argument ops = \['text_length_filter'\]: .*dictionary"):
        Harness([{"name": "data_juicer", "ops": ["text_length_filter"]}])  # the registry checks the type
    with pytest.raises(ValueError, match="data_juicer.ops: expected a list like"):
        Harness([{"name": "data_juicer", "ops": [{"text_length_filter": {}, "extra": {}}]}])  # the op checks its shape


def test_offline_objectives_retokenize_what_a_mapper_rewrote():
    """With `tokenizer` (the tiny model's: one token per character, id 4 + its index in CHARSET, eos 2),
    the rewritten response's tokens follow its text; the old per-token lists go."""
    h = Harness([{"name": "data_juicer", "ops": [{"whitespace_normalization_mapper": {}}],
                  "tokenizer": {"source": "tiny"}}])
    spaced = exp("a", 0, 1, text="4\u3000+ 1", tokens=3, behaviour_logprobs=[-1.0] * 3)
    spaced = spaced.model_copy(update={"response_tokens": [40, 41, 2]})  # generated, ending at eos
    h.feed([spaced, exp("b", 0, 1, text="5 + 1", tokens=2)])
    rewritten, untouched = h.ready
    # "4 + 1": '4' is CHARSET[4] -> 8, ' ' CHARSET[62] -> 66, '+' CHARSET[63] -> 67, '1' -> 5; then eos 2
    assert (rewritten.response_text, rewritten.response_tokens) == ("4 + 1", [8, 66, 67, 66, 5, 2])
    assert rewritten.behaviour_logprobs == [] and rewritten.metadata["retokenized_by"] == "data_juicer"
    assert untouched.response_tokens == [5, 6] and "retokenized_by" not in untouched.metadata  # text unchanged
