from __future__ import annotations

import ssl

import pytest
from pydantic import ValidationError

from undertow.streams import KafkaSettings


def test_env_fills_missing_bootstrap(monkeypatch):
    monkeypatch.setenv("UNDERTOW_BOOTSTRAP", "h1:1, h2:2")
    assert KafkaSettings().with_env().hosts == ["h1:1", "h2:2"]
    assert KafkaSettings(bootstrap_servers="x:9").with_env().hosts == ["x:9"]  # config wins over env


def test_bad_bootstrap_names_the_field():
    with pytest.raises(ValidationError, match="bootstrap_servers"):
        KafkaSettings(bootstrap_servers="localhost")


def test_missing_bootstrap_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("UNDERTOW_BOOTSTRAP", raising=False)
    with pytest.raises(ValueError, match="bootstrap_servers: not set"):
        KafkaSettings().with_env().kafka_python()


def test_sasl_ssl_settings_pass_through_to_every_client():
    s = KafkaSettings(bootstrap_servers="b:9093", security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                      sasl_username="u", sasl_password="p", ssl_check_hostname=False)  # the system's CAs
    kw = s.kafka_python()
    assert kw["security_protocol"] == "SASL_SSL" and kw["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (kw["sasl_plain_username"], kw["sasl_plain_password"]) == ("u", "p")
    assert kw["ssl_check_hostname"] is False and kw["ssl_context"].check_hostname is False
    assert kw["ssl_context"].verify_mode == ssl.CERT_REQUIRED
    assert s.faust_broker() == ["kafka://b:9093"]


def test_plaintext_sends_no_tls_or_sasl_options():
    kw = KafkaSettings(bootstrap_servers="b:1").kafka_python()
    assert not any(k.startswith(("ssl_", "sasl_")) for k in kw)


def test_unknown_setting_is_refused():
    with pytest.raises(ValidationError, match="bootstrap"):
        KafkaSettings(bootstrapservers="b:1")
