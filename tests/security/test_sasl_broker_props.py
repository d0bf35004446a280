"""What LocalKafka writes for a SASL/PLAIN broker, and `broker up --sasl-user`, checked without a JVM."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from undertow.infra.broker.local import LocalKafka
from undertow.infra.cli import app
from tests.security.helpers import props


def test_clients_log_in_with_plain_while_the_controller_stays_plaintext(tmp_path):
    local = LocalKafka(tmp_path, port=30200, sasl_users={"alice": "a-pw", "bob": "b-pw"})
    p = props(local)
    assert p["listeners"] == "SASL_PLAINTEXT://127.0.0.1:30200,CONTROLLER://127.0.0.1:30201"
    assert p["advertised.listeners"] == "SASL_PLAINTEXT://127.0.0.1:30200"
    assert p["listener.security.protocol.map"] == "SASL_PLAINTEXT:SASL_PLAINTEXT,CONTROLLER:PLAINTEXT"
    assert (p["inter.broker.listener.name"], p["sasl.enabled.mechanisms"]) == ("SASL_PLAINTEXT", "PLAIN,SCRAM-SHA-512")
    assert p["sasl.mechanism.inter.broker.protocol"] == "PLAIN"
    assert p["listener.name.sasl_plaintext.plain.sasl.jaas.config"] == (
        'org.apache.kafka.common.security.plain.PlainLoginModule required '
        'username="alice" password="a-pw" user_alice="a-pw" user_bob="b-pw";')


def test_users_are_kept_with_the_cluster_and_give_client_settings(tmp_path):
    LocalKafka(tmp_path / "b", port=30300, sasl_users={"alice": "a-pw"})._save()
    assert (tmp_path / "b").stat().st_mode & 0o077 == 0  # the passwords are readable by their owner only
    again = LocalKafka(tmp_path / "b")  # another process: `broker status`, `down`, the next `up`
    assert again.listener == "SASL_PLAINTEXT"
    s = again.settings()
    assert (s.bootstrap_servers, s.security_protocol, s.sasl_mechanism) == ("127.0.0.1:30300", "SASL_PLAINTEXT", "PLAIN")
    assert (s.sasl_username, s.sasl_password) == ("alice", "a-pw")


def test_without_users_nothing_changes(tmp_path):
    local = LocalKafka(tmp_path, port=30400)
    assert local.listener == "PLAINTEXT" and local.settings().security_protocol == "PLAINTEXT"
    assert not any(k.startswith(("sasl.", "listener.name.")) for k in props(local))


@pytest.mark.parametrize("users, why", [
    ({"al ice": "pw"}, "user name 'al ice'"),
    ({"alice": 'p"w'}, "password of 'alice'"),
    ({"alice": ""}, "password of 'alice'"),
])
def test_names_and_passwords_that_would_break_the_jaas_line_are_refused(tmp_path, users, why):
    with pytest.raises(ValueError, match=f"sasl_users: {why}"):
        LocalKafka(tmp_path, sasl_users=users)


def test_cli_sasl_user_is_checked_before_anything_starts(tmp_path, monkeypatch):
    monkeypatch.delenv("UNDERTOW_BOOTSTRAP", raising=False)

    def up(data: str, user: str) -> tuple[int, str]:
        result = CliRunner().invoke(app, ["broker", "up", "--data", str(tmp_path / data), "--sasl-user", user])
        return result.exit_code, " ".join(result.output.split())  # rich wraps long lines

    assert up("a", "alice") == (2, "error: --sasl-user: expected NAME:PASSWORD, got 'alice'")
    LocalKafka(tmp_path / "b", sasl_users={"alice": "a-pw"})._save()
    code, out = up("b", "bob:b-pw")
    assert code == 2 and "was created with other users" in out


def test_with_acls_the_authorizer_denies_what_no_acl_allows_and_the_first_user_is_super(tmp_path):
    local = LocalKafka(tmp_path / "a", port=30500, sasl_users={"admin": "a-pw", "lab-rollout": "r-pw"}, acls=True)
    p = props(local)
    assert p["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert p["allow.everyone.if.no.acl.found"] == "false"
    assert p["super.users"] == "User:admin;User:ANONYMOUS"  # ANONYMOUS: the nodes on the controller listener
    local._save()
    assert LocalKafka(tmp_path / "a").state.acls  # kept with the cluster for the next `up`
    assert "authorizer.class.name" not in props(LocalKafka(tmp_path / "b", port=30600, sasl_users={"x": "y"}))
    with pytest.raises(ValueError, match="acls: needs sasl_users"):
        LocalKafka(tmp_path / "c", port=30700, acls=True)
