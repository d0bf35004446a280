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
