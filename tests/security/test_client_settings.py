"""kafka-python and Faust read one KafkaSettings the same way: never one with a login and one without."""

from __future__ import annotations

import ssl

import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from kafka import KafkaConsumer
from pydantic import ValidationError

from undertow.streams import KafkaSettings, connect
from tests.security.helpers import client_certificate


def test_a_sasl_protocol_without_a_mechanism_means_plain_for_every_client():
    s = KafkaSettings(bootstrap_servers="b:1", security_protocol="SASL_PLAINTEXT", sasl_username="u", sasl_password="p")
    kw = s.kafka_python()
    assert (kw["security_protocol"], kw["sasl_mechanism"], kw["sasl_plain_username"]) == ("SASL_PLAINTEXT", "PLAIN", "u")
    faust = credentials_to_aiokafka_auth(s.faust_credentials())
    assert (faust["security_protocol"], faust["sasl_mechanism"], faust["sasl_plain_password"]) == ("SASL_PLAINTEXT", "PLAIN", "p")


def test_a_mechanism_without_a_sasl_protocol_is_refused():
    # Before: kafka-python connected without a login while Faust switched to SASL_PLAINTEXT.
    with pytest.raises(ValidationError, match="sasl_mechanism: PLAIN needs security_protocol SASL_PLAINTEXT or SASL_SSL"):
        KafkaSettings(bootstrap_servers="b:1", sasl_mechanism="PLAIN", sasl_username="u", sasl_password="p")


def test_tls_reaches_faust_as_kafka_python_gets_it():
    s = KafkaSettings(bootstrap_servers="b:1", security_protocol="SASL_SSL", sasl_username="u", sasl_password="p",
                      ssl_check_hostname=False)
    faust = credentials_to_aiokafka_auth(s.faust_credentials())
    assert (faust["security_protocol"], faust["ssl_context"].check_hostname) == ("SASL_SSL", False)
    assert faust["ssl_context"].verify_mode == ssl.CERT_REQUIRED  # no hostname check, but the chain still is
    assert s.kafka_python()["ssl_check_hostname"] is False
    plain_tls = credentials_to_aiokafka_auth(s.model_copy(update={"security_protocol": "SSL"}).faust_credentials())
    assert plain_tls["security_protocol"] == "SSL" and plain_tls["ssl_context"].check_hostname is False


def test_a_tls_file_faust_cannot_load_is_a_clear_error_naming_the_setting(tmp_path):
    # Before: a bare FileNotFoundError "[Errno 2] No such file or directory", naming neither file nor setting.
    missing = KafkaSettings(bootstrap_servers="b:1", security_protocol="SSL", ssl_cafile=str(tmp_path / "ca.pem"))
    with pytest.raises(ValueError, match=f"ssl_cafile: cannot load {tmp_path / 'ca.pem'}: .*No such file"):
        missing.faust_credentials()
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(ValueError, match="ssl_cafile: cannot load .*junk.pem"):
        missing.model_copy(update={"ssl_cafile": str(tmp_path / "junk.pem")}).ssl_context()
    no_cert = KafkaSettings(bootstrap_servers="b:1", security_protocol="SSL", ssl_certfile=str(tmp_path / "me.pem"))
    with pytest.raises(ValueError, match="ssl_certfile / ssl_keyfile / ssl_password: cannot load .*me.pem / None"):
        no_cert.ssl_context()


def test_a_kafka_python_client_with_a_wrong_ca_path_fails_at_once_naming_it(tmp_path):
    # Before: kafka-python got the path, failed each handshake and retried until its 30 s bootstrap
    # timeout, then said only that no broker was reachable.
    typo = KafkaSettings(bootstrap_servers="127.0.0.1:1", security_protocol="SSL", ssl_cafile=str(tmp_path / "ca.pme"))
    with pytest.raises(ValueError, match="ssl_cafile: cannot load .*ca.pme"):
        connect(KafkaConsumer, typo)


def test_an_encrypted_client_key_is_opened_with_ssl_password_for_every_client(tmp_path):
    client_certificate(tmp_path, password="s3cret")
    assert "ENCRYPTED" in (tmp_path / "key.pem").read_text()
    s = KafkaSettings(bootstrap_servers="b:1", security_protocol="SSL", ssl_certfile=str(tmp_path / "cert.pem"),
                      ssl_keyfile=str(tmp_path / "key.pem"), ssl_password="s3cret")
    assert isinstance(s.kafka_python()["ssl_context"], ssl.SSLContext)
    assert isinstance(credentials_to_aiokafka_auth(s.faust_credentials())["ssl_context"], ssl.SSLContext)
    for wrong in (None, "guess"):  # None must not prompt on the terminal: it is a clear error too
        with pytest.raises(ValueError, match="ssl_password: cannot load .*cert.pem / .*key.pem"):
            s.model_copy(update={"ssl_password": wrong}).kafka_python()
