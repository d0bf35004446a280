"""What LocalKafka writes for a TLS broker, and `broker up --tls`, checked without a JVM."""

from __future__ import annotations

from typer.testing import CliRunner

from undertow.infra.broker.local import LocalKafka
from undertow.infra.cli import app
from tests.security.helpers import props


def test_the_client_listener_is_ssl_with_the_generated_key_and_ca_while_the_controller_stays_plaintext(tmp_path):
    local = LocalKafka(tmp_path, port=30500, tls=True)
    p = props(local)
    assert p["listeners"] == "SSL://127.0.0.1:30500,CONTROLLER://127.0.0.1:30501"
    assert (p["advertised.listeners"], p["inter.broker.listener.name"]) == ("SSL://127.0.0.1:30500", "SSL")
    assert p["listener.security.protocol.map"] == "SSL:SSL,CONTROLLER:PLAINTEXT"
    assert (p["ssl.keystore.type"], p["ssl.keystore.location"]) == ("PKCS12", str(tmp_path / "tls" / "broker.p12"))
    # Brokers replicate over this listener: they must trust the CA as clients do.
    assert (p["ssl.truststore.type"], p["ssl.truststore.location"]) == ("PEM", str(tmp_path / "tls" / "ca.pem"))
    assert not any(k.startswith("sasl.") for k in p)


def test_users_and_tls_make_sasl_ssl(tmp_path):
    local = LocalKafka(tmp_path, port=30600, sasl_users={"alice": "a-pw"}, tls=True)
    p = props(local)
    assert p["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:PLAINTEXT"
    assert p["listener.name.sasl_ssl.plain.sasl.jaas.config"].endswith('user_alice="a-pw";')
    assert "listener.name.sasl_plaintext.plain.sasl.jaas.config" not in p
    s = local.settings()
    assert (s.security_protocol, s.sasl_username, s.ssl_cafile) == ("SASL_SSL", "alice", str(tmp_path / "tls" / "ca.pem"))


def test_tls_is_kept_with_the_cluster_and_gives_client_settings_that_trust_its_ca(tmp_path):
    LocalKafka(tmp_path / "b", port=30700, tls=True)._save()
    assert (tmp_path / "b").stat().st_mode & 0o077 == 0  # the broker's key will sit in there
    again = LocalKafka(tmp_path / "b")  # another process: `broker status`, `down`, the next `up`
    s = again.settings()
    assert (again.listener, s.security_protocol, s.ssl_cafile) == ("SSL", "SSL", str(tmp_path / "b" / "tls" / "ca.pem"))


def test_without_tls_nothing_changes(tmp_path):
    local = LocalKafka(tmp_path, port=30800)
    assert local.settings().ssl_cafile is None
    assert not any(k.startswith("ssl.") for k in props(local))


def test_cli_tls_on_a_cluster_made_without_it_is_refused_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.delenv("UNDERTOW_BOOTSTRAP", raising=False)
    LocalKafka(tmp_path / "plain")._save()
    result = CliRunner().invoke(app, ["broker", "up", "--data", str(tmp_path / "plain"), "--tls"])
    assert result.exit_code == 2 and "was created without TLS" in " ".join(result.output.split())
    LocalKafka(tmp_path / "tls", tls=True)._save()
    result = CliRunner().invoke(app, ["broker", "status", "--data", str(tmp_path / "tls")])
    assert "SSL clients" in result.output  # nothing runs (exit 1), but the listener is read back
