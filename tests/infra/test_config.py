from __future__ import annotations

import pytest

from undertow.kernel.config_io import ConfigError
from undertow.infra.run.config import load_component_config


def test_config_sections_are_read(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("namespace: lab\nkafka:\n  bootstrap_servers: a:1,b:2\n  security_protocol: SASL_SSL\n")
    cfg = load_component_config(path)
    assert cfg.namespace == "lab" and cfg.kafka.hosts == ["a:1", "b:2"]
    assert cfg.kafka.security_protocol == "SASL_SSL"


def test_bad_config_names_the_field_and_the_expected_value(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("kafka:\n  security_protocol: TLS\n")
    with pytest.raises(ConfigError) as e:
        load_component_config(path)
    msg = str(e.value)
    assert "kafka.security_protocol" in msg and "'SASL_SSL'" in msg and "'TLS'" in msg


def test_a_config_that_is_not_a_mapping_is_refused(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        load_component_config(path)



@pytest.mark.parametrize("yaml_text, field, hint", [
    ("rollout: {reward: numeric_matchh}", "rollout.reward", "did you mean 'numeric_match'?"),
    ("processors: {pipeline: [clean, reshap]}", "processors.pipeline", "did you mean 'reshape'?"),
    ("processors: {pipeline: [{name: reshape, advantag: grpo}]}", "processors.pipeline", "did you mean 'advantage'?"),
    ("trainer: {algorithm: {policy_loss: ppo_clp}}", "trainer.algorithm.policy_loss", "did you mean 'ppo_clip'?"),
    ("trainer: {batchng: {experiences: 8}}", "trainer.batchng", "did you mean 'batching'?"),
    ("trainer: {batching: {max_stalenes: 2}}", "trainer.batching.max_stalenes", "did you mean 'max_staleness'?"),
    ("run: {stages: [{name: a, steps: 1, trainr: {}}]}", "run.stages.0.trainr", "did you mean 'trainer'?"),
    ("evals: {every: 5}", "evals", "did you mean 'eval'?"),
])
def test_a_misspelt_name_or_key_gets_the_nearest_valid_one(tmp_path, yaml_text, field, hint):
    path = tmp_path / "c.yaml"
    path.write_text(yaml_text + "\n")
    with pytest.raises(ConfigError) as e:
        load_component_config(path)
    line = next(line for line in str(e.value).splitlines() if f": {field}:" in line)
    assert hint in line, str(e.value)


def test_a_name_far_from_every_valid_one_gets_no_guess(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("trainer: {algorithm: {policy_loss: zzzzzz}}\n")
    with pytest.raises(ConfigError) as e:
        load_component_config(path)
    assert "did you mean" not in str(e.value) and "expected one of" in str(e.value)


def test_topics_section_sets_partitions_and_warns_of_idle_workers(tmp_path):
    from undertow.streams.topics import IdleWorkers

    path = tmp_path / "c.yaml"
    path.write_text("topics:\n  partitions: {tasks: 2, experiences.raw: 8}\n  replication: 3\n"
                    "rollout: {workers: 3}\nrun: {processor_workers: 8}\n")
    with pytest.warns(IdleWorkers) as seen:
        cfg = load_component_config(path)
    assert cfg.topics.count("tasks") == 2 and cfg.topics.replication == 3
    # 3 rollout workers on 2 task partitions; 8 processor workers on 8 raw partitions is no warning
    assert [str(w.message).split(":")[0] for w in seen] == ["rollout.workers (3) > partitions of tasks (2)"]


def test_a_bad_partition_count_fails_naming_the_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("topics:\n  partitions: {weights: 3}\n")
    with pytest.raises(ConfigError, match=r"topics\.partitions.*weights: keeps 1 partition"):
        load_component_config(path)


@pytest.mark.parametrize("cpus, error", [
    ("{trainr: '0'}", r"run\.cpus.*'trainr' is not a component"),
    ("{trainer: '1-0'}", r"run\.cpus.*'1-0' is not a CPU list"),
    ("{trainer: 'a'}", r"run\.cpus.*'a' is not a CPU list"),
    ("{rollout: '4096'}", r"run\.cpus.*cpus\.rollout: CPU \[4096\] not usable here"),
])
def test_cpu_pinning_names_the_bad_component_or_cpu(tmp_path, cpus, error):
    path = tmp_path / "c.yaml"
    path.write_text(f"run:\n  cpus: {cpus}\n")
    with pytest.raises(ConfigError, match=error):
        load_component_config(path)
