"""`undertow serve`'s API keys: read from a variable or a file (never the config), required beyond
loopback, every route but /health refused without a valid bearer token, no key in any log line."""

from __future__ import annotations

import logging

import openai
import pytest
from pydantic import ValidationError
from starlette.testclient import TestClient
from typer.testing import CliRunner

from undertow.kernel.models import ModelSpec
from undertow.rollout.engines import SamplingParams
from undertow.rollout.engines.transformers_engine import TransformersEngine
from undertow.rollout.serve.app import build_app
from undertow.rollout.serve.endpoint import Endpoint
from undertow.rollout.serve.keys import ApiKeys, KeyCheck, check_binding, is_loopback, load_keys

KEY, OTHER = "sk-undertow-3f9a1c", "sk-undertow-77e2b0"
HI = {"model": "policy", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def guarded():
    endpoint = Endpoint(TransformersEngine(ModelSpec(), seed=0), "policy", SamplingParams(max_new_tokens=2))
    return TestClient(build_app(endpoint, frozenset({KEY, OTHER})))


def test_keys_come_from_a_variable_or_a_file_and_an_empty_source_is_an_error(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVE_KEYS", f" {KEY},\n{OTHER} ,")
    assert load_keys(ApiKeys(env="SERVE_KEYS")) == {KEY, OTHER}
    keys = tmp_path / "keys"
    keys.write_text(f"# the agents' keys\n{KEY}\n\n{OTHER}\n")
    assert load_keys(ApiKeys(file=str(keys))) == {KEY, OTHER}
    for where, message in [(ApiKeys(env="NO_SUCH_VARIABLE"), r"\$NO_SUCH_VARIABLE is not set"),
                           (ApiKeys(file=str(tmp_path / "none")), "is not a file")]:
        with pytest.raises(ValueError, match=message):
            load_keys(where)
    monkeypatch.setenv("SERVE_KEYS", " , ")
    with pytest.raises(ValueError, match="holds no key"):
        load_keys(ApiKeys(env="SERVE_KEYS"))
    for both_or_none in ({}, {"env": "A", "file": "b"}):
        with pytest.raises(ValidationError, match="exactly one"):
            ApiKeys(**both_or_none)
    with pytest.raises(ValidationError):  # the keys themselves are not a field
        ApiKeys(keys=[KEY])


def test_beyond_loopback_the_endpoint_needs_keys():
    assert all(map(is_loopback, ["127.0.0.1", "127.8.0.3", "::1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.1.2.3", "serve.example"]))
    check_binding("127.0.0.1", frozenset())
    check_binding("0.0.0.0", frozenset({KEY}))
    with pytest.raises(ValueError, match="--host 0.0.0.0: bound beyond loopback, the endpoint needs API keys"):
        check_binding("0.0.0.0", frozenset())


def test_the_cli_refuses_to_serve_beyond_loopback_without_keys_before_starting_anything(tmp_path):
    from undertow.infra.cli import app

    config = tmp_path / "serve.yaml"
    config.write_text("namespace: keys-test\nmodel: {source: tiny}\n")
    # 198.51.100.0/24 is a documentation range: nothing is bound or reached, the check comes first.
    result = CliRunner().invoke(app, ["serve", str(config), "--host", "198.51.100.7", "--bootstrap", "127.0.0.1:1"])
    assert result.exit_code != 0
    assert "bound beyond loopback, the endpoint needs API keys" in result.output


def test_only_a_configured_bearer_key_passes():
    check = KeyCheck(frozenset({KEY, OTHER}))
    assert check.allows(f"Bearer {KEY}") and check.allows(f"bearer {OTHER}")
    for header in (None, "", KEY, f"Basic {KEY}", f"Bearer {KEY}x", f"Bearer {KEY[:-1]}", "Bearer "):
        assert not check.allows(header), header
    assert not KeyCheck(frozenset()).required and check.required


@pytest.mark.parametrize("method, path", [("post", "/v1/chat/completions"), ("get", "/v1/models"),
                                          ("get", "/v1/models/policy"),
                                          ("post", "/v1/undertow/sessions/s1/reward"),
                                          ("delete", "/v1/undertow/sessions/s1")])
def test_every_route_but_health_answers_401_without_a_valid_key(guarded, method, path, caplog):
    caplog.set_level(logging.DEBUG)
    for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": KEY}):
        r = getattr(guarded, method)(path, headers=headers, **({"json": HI} if method == "post" else {}))
        assert r.status_code == 401, (headers, r.text)
        assert r.json()["error"]["code"] == "invalid_api_key"
    assert guarded.get("/health").status_code == 200
    assert KEY not in caplog.text and OTHER not in caplog.text


def test_the_openai_client_with_a_key_is_answered_and_without_one_is_told_why(guarded):
    agent = openai.OpenAI(base_url="http://testserver/v1", api_key=OTHER, http_client=guarded, max_retries=0)
    assert agent.chat.completions.create(**HI).choices[0].message.content is not None
    stranger = openai.OpenAI(base_url="http://testserver/v1", api_key="sk-guess", http_client=guarded, max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="Missing or invalid API key"):
        stranger.models.list()
