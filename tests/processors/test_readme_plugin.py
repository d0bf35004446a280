"""The plugin example written for the README works as written, by dotted path and by short name."""

from pathlib import Path

from undertow.processors import Harness
from tests.helpers import exp, group


def test_readme_plugin_example():
    assert len(Path(__file__).with_name("readme_plugin.py").read_text().splitlines()) < 15
    for name in ("tests.processors.readme_plugin.drop_truncated", "drop_truncated"):
        h = Harness(["clean", {"name": name, "max_tokens": 4}, "reshape"])
        g = group("a", [1.0, 0.0, 1.0])
        g[1] = exp("a", 1, 3, 0.0, finish="length")
        g[2] = exp("a", 2, 3, 1.0, tokens=5)
        h.feed(g)
        assert [e.experience_id for e in h.ready] == ["a/0"]
        assert [r for _, r in h.reasons()] == ["truncated", "truncated"]
