from __future__ import annotations

import pytest

from pydantic import ValidationError

from undertow.streams import CATALOG, Topics, TopicsConfig
from undertow.streams.topics import FOREVER, idle_workers


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


def test_partitions_come_from_config_per_topic():
    cfg = TopicsConfig(partitions={"tasks": 8, "experiences.raw": 6})
    # 8 and 6 set; experiences.ready keeps the catalog's 4, metrics its 1
    assert [cfg.count(s) for s in ("tasks", "experiences.raw", "experiences.ready", "metrics")] == [8, 6, 4, 1]


@pytest.mark.parametrize("partitions, names", [({"taks": 4}, "'taks' is no topic"), ({"tasks": 0}, "tasks: expected at least 1"),
                                               ({"weights": 2}, "weights: keeps 1 partition")])
def test_bad_partition_counts_fail_naming_the_topic(partitions, names):
    with pytest.raises(ValidationError, match=names):
        TopicsConfig(partitions=partitions)


def test_more_workers_than_partitions_names_both_numbers():
    cfg = TopicsConfig(partitions={"tasks": 4})
    found = idle_workers(cfg, {"tasks": ("rollout.workers", 6), "experiences.raw": ("run.processor_workers", 4)})
    assert found == ["rollout.workers (6) > partitions of tasks (4): 2 worker(s) would get no partition and sit "
                     "idle; set topics.partitions.tasks to at least 6"]  # 4 processor workers on 4 partitions: fine
