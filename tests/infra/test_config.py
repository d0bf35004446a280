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

