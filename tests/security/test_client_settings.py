"""kafka-python and Faust read one KafkaSettings the same way: never one with a login and one without."""

from __future__ import annotations

import pytest
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth
from pydantic import ValidationError

from streams import KafkaSettings


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
