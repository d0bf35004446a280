"""A shadow trainer: a second trainer setting on the run's ready topic, trained on exactly the
experiences the run's trainer trained on, into topics, checkpoints and charts of its own."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import yaml

from undertow.infra.report.series import build_panels
from undertow.infra.run.config import RunConfig, load_component_config
from undertow.infra.run.runner import Run
from undertow.infra.run.supervisor import Supervisor
from undertow.kernel.models import build_model, load_weights
from undertow.rollout.eval_runner import follow
from undertow.schemas import EvalResult, MetricEvent
from undertow.streams import RunContext, Topics, list_topics

from tests.helpers import read_all
from tests.rollout.test_evaluation import HELDOUT
from .helpers import finish, make_group, produce, start_trainer, write_config
from .test_train_on_broker import latest_weights


def test_a_shadow_names_its_own_topics_and_reads_the_runs():
    run, shadow = Topics("demo"), Topics("demo", shadow="gspo")
    assert (shadow.ready, shadow.raw, shadow.tasks, shadow.metrics) == (run.ready, run.raw, run.tasks, run.metrics)
    assert (shadow.weights, shadow.rejected, shadow.evals) == (
        "demo.shadow-gspo.weights", "demo.shadow-gspo.experiences.rejected", "demo.shadow-gspo.evals")
    assert (shadow.owner, shadow.component("eval"), run.component("eval")) == ("demo.shadow-gspo", "eval@gspo", "eval")
    assert set(shadow.specs()) - set(run.specs()) == {shadow.weights, shadow.rejected, shadow.evals}
    with pytest.raises(ValueError, match="shadow"):
        Topics("demo", shadow="a.b")


def test_a_shadows_trainer_is_the_runs_with_its_overrides_and_a_bad_one_is_named():
    cfg = RunConfig.model_validate({"trainer": {"engine": {"lr": 0.01}},
                                    "shadows": [{"name": "gspo", "trainer": {"algorithm": {"policy_loss": "gspo"}}}]})
    shadow = cfg.shadow_trainer("gspo")
    assert (shadow.algorithm.policy_loss, shadow.engine.lr) == ("gspo", 0.01)
    assert cfg.trainer.algorithm.policy_loss == "ppo_clip"
    with pytest.raises(ValueError, match="the config's shadows are"):
        cfg.shadow_trainer("dapo")
    bad = [({"shadows": [{"name": "x", "trainer": {"algorithm": {"policy_los": "gspo"}}}]},
            r"shadows.0.trainer: algorithm.policy_los.*did you mean 'policy_loss'"),
           ({"shadows": [{"name": "x"}, {"name": "x"}]}, "names must differ"),
           ({"shadows": [{"name": "x", "trainer": {"weights": {"transport": "broadcast", "uri": "/tmp/w"}}}]},
            "shadows.0.trainer.weights.transport: broadcast")]
    for raw, message in bad:
        with pytest.raises(ValueError, match=message):
            RunConfig.model_validate(raw)


@pytest.mark.broker
@pytest.mark.slow
def test_a_shadow_trains_the_same_experiences_into_its_own_topics_and_curves(kafka, namespace, tmp_path: Path):
    topics, shadow_topics = Topics(namespace), Topics(namespace, shadow="slow")
    groups = [e for g in range(6) for e in make_group(f"task-{g}")]  # 24 experiences, groups of 4
    produce(kafka, topics.ready, groups)
    settings = {"engine": {"zero_stage": 0, "lr": 0.01}, "batching": {"experiences": 8},
                "sync_every": 3, "checkpoint_every": 100}
    config = write_config(tmp_path, namespace, settings)
    raw = {**yaml.safe_load(config.read_text()),
           "shadows": [{"name": "slow", "trainer": {"engine": {"lr": 0.001}}}],
           "rollout": {"chat_template": False, "sampling": {"max_new_tokens": 3},
                       "reward": "tests.rollout.plugins.sevens"}, "eval": {**HELDOUT, "every": 3}}
    config.write_text(yaml.safe_dump(raw))
    spec = load_component_config(config).model

    # The run's trainer first; the shadow afterwards on the same log, as if started late.
    finish(start_trainer(config, "--max-steps", "3"), 240)
    finish(start_trainer(config, "--max-steps", "3", "--shadow", "slow"), 240)

    ledgers = {who: [i for line in (tmp_path / "ckpt" / who / "ledger.jsonl").read_text().splitlines()
                     for i in json.loads(line)["ids"]] for who in (namespace, f"{namespace}.shadow-slow")}
    assert sorted(ledgers[namespace]) == sorted(ledgers[f"{namespace}.shadow-slow"]) == sorted(
        e.experience_id for e in groups)
    # Each published its version 3 to its own topic; a smaller lr moved the shadow's weights less.
    (main_version, main_blob), (shadow_version, shadow_blob) = (latest_weights(kafka, t.weights)
                                                                for t in (topics, shadow_topics))
    assert main_version == shadow_version == 3
    start, moved = build_model(spec), {}
    for who, blob in (("run", main_blob), ("shadow", shadow_blob)):
        model = build_model(spec)
        load_weights(model, blob)
        moved[who] = sum((a - b).norm() for a, b in zip(model.parameters(), start.parameters())).item()
    assert 0 < moved["shadow"] < moved["run"]
    components = [m.component for m in read_all(kafka, topics.metrics, expect=MetricEvent)]
    assert components.count("trainer") == components.count("trainer@slow") == 3

    # Both evaluated from one stream: the report draws two held-out curves, the shadow's apart.
    cfg = RunConfig.model_validate(raw)
    for shadow in (None, "slow"):
        context = RunContext(namespace=namespace, kafka=kafka, model=cfg.model, shadow=shadow)
        stop = threading.Event()
        stop.set()  # score the starting weights and the newest version, then return
        assert follow(cfg.eval, cfg.rollout, context, stop) == [0, 3]
    assert {r.version for r in read_all(kafka, shadow_topics.evals, expect=EvalResult)} == {0, 3}
    rows = [{"component": m.component, "time": float(i), "stage": "rl", **m.values}
            for i, m in enumerate(read_all(kafka, topics.metrics, expect=MetricEvent))]
    heldout = next(p for p in build_panels(rows) if p.key == "heldout")
    labels = {c.label for c in heldout.curves}
    assert {"rl/eval:sums-heldout/greedy_accuracy", "rl/eval@slow:sums-heldout/greedy_accuracy"} <= labels



@pytest.mark.broker  # a stage creates its topics (the shadow's too) and records its metrics
def test_undertow_run_starts_each_shadows_trainer_and_evaluator_and_waits_for_them(kafka, namespace, tmp_path,
                                                                                   monkeypatch):
    started: list[tuple[str, list[str]]] = []
    stopped: list[list[str]] = []
    monkeypatch.setattr(Supervisor, "start", lambda self, name, argv, env=None: started.append((name, argv)))
    monkeypatch.setattr(Supervisor, "stop", lambda self, names=None, timeout=60.0, timeouts=None: stopped.append(names))
    monkeypatch.setattr(Run, "_watch", lambda self, sup, watch, recorder, drain: ("done", ""))
    raw = {"namespace": namespace, "model": {"source": "tiny"}, "eval": HELDOUT, "run": {"steps": 7},
           "shadows": [{"name": "gspo", "trainer": {"algorithm": {"policy_loss": "gspo"}}}]}
    run = Run(RunConfig.model_validate(raw), raw, tmp_path)
    run.kafka = kafka
    assert run._run_stage(0, None).status == "done"
    argv = dict(started)
    assert argv["trainer@gspo"][-6:] == ["train", str(tmp_path / "stages" / "0-main.yaml"), "--shadow", "gspo",
                                         "--max-steps", "7"]
    assert argv["eval@gspo"][-2:] == ["--shadow", "gspo"]
    (order,) = stopped
    assert order.index("trainer") < order.index("trainer@gspo") < order.index("eval") < order.index("eval@gspo")
    assert Topics(namespace, shadow="gspo").weights in list_topics(kafka)
