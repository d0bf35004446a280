"""The endpoint through the real broker: an agent drives a 2-turn episode with the `openai` client,
reports its reward, and the episode lands on <ns>.experiences.raw token-in/token-out, masked."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import openai
import pytest
import uvicorn
import yaml

from undertow.kernel.models import ModelSpec
from undertow.schemas import Experience, MetricEvent
from undertow.streams import RecordProducer, Topics
from undertow.rollout.serve import Episode
from undertow.rollout.serve.app import build_app, server_config
from undertow.rollout.serve.endpoint import Endpoint
from tests.helpers import ROOT, env, load_run, read_all, start_cli, wait_for
from tests.rollout.test_generation import trainer_logprobs
from tests.rollout.test_worker_broker import publish_weights

pytestmark = [pytest.mark.broker]


def test_an_agent_episode_through_the_openai_client_is_published_with_its_masks(kafka, namespace, config_path):
    # Engine seed 0: the first answer's sixth token is <bos>, which its text drops (checked below), so
    # re-tokenizing the conversation the agent sends back would lose a token the policy generated.
    rollout = {"engine": {"name": "transformers", "seed": 0}, "sampling": {"max_new_tokens": 6, "temperature": 1.0}}
    config, context = load_run(config_path(rollout=rollout), kafka)
    endpoint = Endpoint.connect(config.rollout, context, "serve-t")
    seen = []  # what the engine was asked and gave: the test's independent record of the tokens
    generate = endpoint.engine.generate
    endpoint.engine.generate = lambda prompts, n, params: seen.append((prompts[0], generate(prompts, n, params))) or seen[-1][1]
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(server_config(build_app(endpoint), log_level="warning"))
    endpoint.start()
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        wait_for(lambda: server.started, timeout=30, what="server up")
        base = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        episode = Episode(base, "ep-1", group="task-7", group_size=2, sample=1)
        agent = openai.OpenAI(base_url=base, api_key="-", default_headers=episode.headers, max_retries=0)
        messages = [{"role": "user", "content": "What is 2+3?"}]
        first = agent.chat.completions.create(model="policy", messages=messages)
        # The trainer publishes v1 between the agent's turns: the second turn is generated with it.
        with RecordProducer(kafka) as producer:
            publish_weights(producer, Topics(namespace), 1, seed=7)
        wait_for(lambda: endpoint.subscriber.held == 1, what="v1 brought in")
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "Sure?"}]
        second = agent.chat.completions.create(model="policy", messages=messages)
        with pytest.raises(openai.NotFoundError) as unknown:
            agent.chat.completions.create(model="gpt-4o", messages=messages)
        with pytest.raises(openai.BadRequestError) as edited:
            agent.chat.completions.create(model="policy", messages=messages[:1] + [{"role": "user", "content": "x"}])
        assert (unknown.value.code, edited.value.code) == ("model_not_found", "session_history_mismatch")
        answer = episode.report(reward=0.5)
        with pytest.raises(RuntimeError, match="404"):  # published once, then closed
            episode.report(reward=0.5)
        # An episode whose agent goes quiet past serve.session_ttl_s (600 s) is dropped unpublished.
        idle = Episode(base, "ep-idle", group="task-8")
        openai.OpenAI(base_url=base, api_key="-", default_headers=idle.headers, max_retries=0).chat.completions.create(
            model="policy", messages=messages[:1])
        assert endpoint.expire_idle(now=time.monotonic() + 601) == ["ep-idle"]
        with pytest.raises(RuntimeError, match="404.*session_expired"):
            idle.report(reward=1.0)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        endpoint.close()

    (prompt1, [[g1]]), (prompt2, [[g2]]), _ = seen  # one prompt, one sample each turn (then ep-idle's)
    assert endpoint.tokenizer(g1.text, add_special_tokens=False)["input_ids"] != g1.tokens  # the trap is set
    assert first.choices[0].message.content == g1.text and second.choices[0].message.content == g2.text
    published = read_all(kafka, Topics(namespace).raw, Experience)
    [exp] = [e for e in published if e.group_id == "task-7"]
    assert not [e for e in published if e.group_id == "task-8"]  # the expired one never is
    expired = [m.values for m in read_all(kafka, Topics(namespace).metrics, MetricEvent) if "sessions_expired" in m.values]
    assert expired == [{"sessions_expired": 1.0, "sessions_expired_total": 1.0}]
    assert answer["experience_id"] == exp.experience_id == "task-7/1" and (exp.group_size, exp.sample_index) == (2, 1)
    # The tiny template: one token per character; the new message follows the model's own tokens.
    observation = "\nuser: Sure?\nassistant: "
    assert prompt1 == exp.prompt_tokens and exp.prompt_text == "user: What is 2+3?\nassistant: "
    obs = endpoint.tokenizer(observation, add_special_tokens=False)["input_ids"]
    assert len(obs) == len(observation) == 24
    assert exp.response_tokens == g1.tokens + obs + g2.tokens  # exactly what the engine generated
    assert prompt2 == prompt1 + g1.tokens + obs  # and exactly what the engine saw on the second turn
    assert exp.loss_mask == [1] * len(g1.tokens) + [0] * 24 + [1] * len(g2.tokens)
    assert exp.behaviour_logprobs == g1.logprobs + [0.0] * 24 + g2.logprobs
    assert exp.reward == 0.5 and exp.reward_components == {"reward": 0.5}
    # Turn 2 came from v1: its log-probs are v1's as a trainer recomputes them. The experience
    # counts as v0's (its oldest turn), so the trainer's staleness bound holds for every token.
    assert exp.policy_version == 0 and exp.metadata["turn_versions"] == [0, 1] and endpoint.version == 1
    start = len(g1.tokens) + 24
    v1 = trainer_logprobs(ModelSpec(seed=7), [exp], 1.0)[0][start:]
    assert max(abs(a - b) for a, b in zip(exp.behaviour_logprobs[start:], v1)) <= 1e-4
    assert exp.metadata["worker"] == "serve-t" and exp.metadata["tokenizer"] == endpoint.fingerprint


def test_undertow_serve_answers_until_sigterm(kafka, namespace, config_path):
    """The entry point: `undertow serve CONFIG` answers a completion and exits 0 on SIGTERM."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = start_cli("serve", str(config_path(rollout={"sampling": {"max_new_tokens": 4}})), "--port", str(port))
    try:
        base = f"http://127.0.0.1:{port}/v1"
        wait_for(lambda: _models(base), timeout=120, what="undertow serve up", proc=proc, every=0.5)
        reply = openai.OpenAI(base_url=base, api_key="-", max_retries=0).chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "1+1?"}], max_tokens=3)
        assert reply.usage.completion_tokens <= 3 and reply.choices[0].message.role == "assistant"
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, out[-3000:]


@pytest.mark.slow
def test_200_agents_at_once_each_get_their_own_episode_published_once_and_a_201st_is_told_to_wait(
        kafka, namespace, config_path):
    """200 sessions play 3 turns each concurrently through the openai client against a served tiny
    model (serve.max_sessions 200): while all are open a new session is a 429, then every episode
    is published exactly once, holding its own three turns and no other session's."""
    sessions, turns = 200, 3
    config, context = load_run(config_path(rollout={"sampling": {"max_new_tokens": 3}},
                                           serve={"max_sessions": sessions}), kafka)
    endpoint = Endpoint.connect(config.rollout, context, "serve-load", config.serve)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(server_config(build_app(endpoint), log_level="warning"))
    endpoint.start()
    threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
    base = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    all_open = threading.Barrier(sessions + 1, timeout=300)
    failures: list[str] = []

    def play(i: int) -> None:
        episode = Episode(base, f"load-{i}", group=f"load-{i}")
        agent = openai.OpenAI(base_url=base, api_key="-", default_headers=episode.headers, max_retries=0, timeout=120)
        messages = []
        try:
            for t in range(turns):
                messages.append({"role": "user", "content": f"<{i}:{t}>"})
                reply = agent.chat.completions.create(model="policy", messages=messages)
                messages.append({"role": "assistant", "content": reply.choices[0].message.content})
                if t == 0:
                    all_open.wait()  # every session open: the test tries a 201st
                    all_open.wait()
            episode.report(reward=float(i))
        except Exception as e:  # noqa: BLE001 - named in the assertion below
            failures.append(f"session {i}: {type(e).__name__}: {e}")
            all_open.abort()

    players = [threading.Thread(target=play, args=(i,), daemon=True) for i in range(sessions)]
    try:
        wait_for(lambda: server.started, timeout=30, what="server up")
        for p in players:
            p.start()
        try:
            all_open.wait()
        except threading.BrokenBarrierError:
            pass
        assert not failures and endpoint.sessions_open == sessions, (endpoint.sessions_open, failures[:5])
        late = openai.OpenAI(base_url=base, api_key="-", max_retries=0,
                             default_headers=Episode(base, "late", group="late").headers)
        with pytest.raises(openai.RateLimitError) as refused:
            late.chat.completions.create(model="policy", messages=[{"role": "user", "content": "<late>"}])
        assert refused.value.code == "too_many_sessions"
        all_open.wait()
        for p in players:
            p.join(timeout=300)
        assert not failures, failures[:5]
    finally:
        server.should_exit = True
        endpoint.close()
    published = [e for e in read_all(kafka, Topics(namespace).raw, Experience)]
    assert sorted(e.group_id for e in published) == sorted(f"load-{i}" for i in range(sessions))
    for e in published:
        i = int(e.group_id.split("-")[1])
        text = endpoint.tokenizer.decode(e.prompt_tokens + e.response_tokens)
        assert re.findall(r"<(\d+):(\d+)>", text) == [(str(i), str(t)) for t in range(turns)], (e.group_id, text)
        assert e.reward == float(i)


@pytest.mark.slow
def test_the_readmes_serve_command_works_on_a_fresh_machine(tmp_path, config_path):
    """No cluster configured and no broker running: `undertow serve CONFIG` starts the local broker
    (as `undertow broker up`), creates the namespace's topics, and a reported episode is published."""
    from undertow.infra.broker.local import LocalKafka

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    home, config = tmp_path / "home", config_path(rollout={"sampling": {"max_new_tokens": 4}})
    proc = subprocess.Popen([sys.executable, "-m", "undertow.infra.cli", "serve", str(config), "--port", str(port)],
                            env={k: v for k, v in env(UNDERTOW_HOME=str(home)).items() if k != "UNDERTOW_BOOTSTRAP"},
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    running = None
    try:
        base = f"http://127.0.0.1:{port}/v1"
        wait_for(lambda: _models(base), timeout=240, what="undertow serve up with its own broker", proc=proc, every=0.5)
        running = LocalKafka(home / "broker").running_nodes()  # its state as serve left it on disk
        episode = Episode(base, group="fresh-1")
        openai.OpenAI(base_url=episode.base_url, api_key="-", default_headers=episode.headers, max_retries=0) \
            .chat.completions.create(model="policy", messages=[{"role": "user", "content": "1+1?"}])
        episode.report(reward=1.0)
        ns = yaml.safe_load(config.read_text())["namespace"]
        published = read_all(LocalKafka(home / "broker").settings(), Topics(ns).raw, Experience)
        assert [e.group_id for e in published] == ["fresh-1"]
    finally:
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
        LocalKafka(home / "broker").stop()  # serve leaves it running, as `undertow broker up` does
    assert running and proc.returncode == 0 and "starting the local broker" in out, out[-3000:]


def _models(base: str) -> list | None:
    try:
        with urllib.request.urlopen(base + "/models", timeout=2) as response:
            return json.loads(response.read())["data"]
    except OSError:
        return None
