"""`undertow run` starts `undertow watch` beside a stage when the config names watchers, and stops
it after the trainer and the evaluator (children faked: only the wiring is under test)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from undertow.infra.run.runner import Run
from undertow.infra.run.config import RunConfig
from undertow.infra.run.supervisor import Supervisor

pytestmark = [pytest.mark.broker]  # a stage creates its topics and records its metrics


@pytest.mark.parametrize("watchers", [[], ["entropy_collapse", {"name": "response_length", "factor": 3}]])
def test_run_starts_watch_only_when_watchers_are_named(kafka, namespace, tmp_path, monkeypatch, watchers):
    started: list[tuple[str, list[str]]] = []
    stopped: list[list[str]] = []
    monkeypatch.setattr(Supervisor, "start", lambda self, name, argv, env=None: started.append((name, argv)))
    monkeypatch.setattr(Supervisor, "stop", lambda self, names=None, timeout=60.0, timeouts=None: stopped.append(names))
    monkeypatch.setattr(Run, "_watch", lambda self, sup, watch, recorder, drain: ("done", ""))
    raw = {"namespace": namespace, "model": {"source": "tiny"}, "watchers": watchers}
    run = Run(RunConfig.model_validate(raw), raw, tmp_path)
    run.kafka = kafka
    assert run._run_stage(0, None).status == "done"
    watch = [argv for name, argv in started if name == "watch"]
    if not watchers:
        assert watch == []
        return
    (argv,) = watch
    assert argv[-2:] == ["watch", str(tmp_path / "stages" / "0-main.yaml")]
    assert yaml.safe_load(Path(argv[-1]).read_text())["watchers"] == watchers  # what `undertow watch` will read
    (order,) = stopped
    assert order.index("trainer") < order.index("eval") < order.index("watch") < order.index("monitor")
