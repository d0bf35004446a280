"""The watcher example of the README works as written: by dotted path, in the harness."""

from __future__ import annotations

import re
import sys

from tests.helpers import ROOT, exp
from undertow.watchers import Harness


def test_readme_watcher_example(tmp_path, monkeypatch):
    (block,) = re.findall(r"```python\n(# my_lab/watchers\.py.*?)```", (ROOT / "README.md").read_text(), re.S)
    assert len(block.splitlines()) < 15  # a user's watcher is short
    (tmp_path / "my_lab").mkdir()
    (tmp_path / "my_lab" / "watchers.py").write_text(block)
    monkeypatch.syspath_prepend(str(tmp_path))
    # Other README tests make a my_lab package of their own: this one must not find theirs.
    for name in ("my_lab", "my_lab.watchers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    h = Harness({"name": "my_lab.watchers.too_long", "max_tokens": 4})
    assert h.feed([exp("a", tokens=4), exp("b", tokens=5)]) == h.alerts
    (alert,) = h.alerts
    assert (alert.alert, alert.value, alert.threshold) == ("too_long", 5, 4)
    assert h.events[0].labels == {"watcher": "my_lab.watchers.too_long", "alert": "too_long"}
