from __future__ import annotations

import pytest

from undertow.streams import CATALOG, Topics
from undertow.streams.topics import FOREVER


def test_catalog_has_every_topic_of_the_design():
    # DESIGN.md's eight, and the expert demonstrations an RL step may mix in (trainer.mixing, README "Topics")
    assert {s.suffix for s in CATALOG} == {"tasks", "experiences.raw", "experiences.ready", "experiences.rejected",
                                           "experiences.expert", "weights", "task-stats", "metrics", "evals"}


def test_names_carry_the_namespace():
    t = Topics("demo")
    assert (t.tasks, t.raw, t.ready, t.rejected) == (
        "demo.tasks", "demo.experiences.raw", "demo.experiences.ready", "demo.experiences.rejected")
    assert (t.weights, t.task_stats, t.metrics, t.evals, t.expert) == (
        "demo.weights", "demo.task-stats", "demo.metrics", "demo.evals", "demo.experiences.expert")
    assert set(t.specs()) == {f"demo.{s.suffix}" for s in CATALOG}


def test_experience_topics_are_kept_for_replay_and_stats_compacted():
    specs = {s.suffix: s for s in CATALOG}
    for suffix in ("experiences.raw", "experiences.ready", "experiences.rejected"):
        assert specs[suffix].topic_configs(1)["retention.ms"] == str(FOREVER)
    assert specs["task-stats"].topic_configs(1)["cleanup.policy"] == "compact"
    assert specs["weights"].partitions == 1  # chunks of one version stay in order


def test_replicated_topics_require_two_in_sync_replicas():
    spec = CATALOG[0]
    assert "min.insync.replicas" not in spec.topic_configs(1)
    assert spec.topic_configs(3)["min.insync.replicas"] == "2"


@pytest.mark.parametrize("bad", ["", "a.b", "a b", "x/y"])
def test_bad_namespace_is_refused(bad):
    with pytest.raises(ValueError, match="namespace"):
        Topics(bad)
