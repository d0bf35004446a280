"""The OpenAI-compatible endpoint without a broker: tool-call parsing, the token-in/token-out session
recorder (hand-worked on the tiny model's one-token-per-character tokenizer), and OpenAI's errors."""

from __future__ import annotations

import json
import threading
import time

import openai
import pytest
import torch
from starlette.applications import Starlette
from starlette.testclient import TestClient

from undertow.kernel.models import ModelSpec, char_tokenizer
from undertow.rollout.engines import SamplingParams
from undertow.rollout.engines.transformers_engine import TransformersEngine
from undertow.rollout.serve.app import build_app, server_config
from undertow.rollout.serve.config import ServeConfig
from undertow.rollout.serve.endpoint import Endpoint
from undertow.rollout.serve.protocol import completion
from undertow.rollout.serve.sessions import Generated, Session, SessionMismatch, render
from undertow.rollout.serve.tool_calls import split_tool_calls

# A chat template that renders tools (the tiny model's does not): the tool names on a first line.
TOOLS_TEMPLATE = ("{% if tools %}tools: {% for t in tools %}{{ t['function']['name'] }} {% endfor %}{{ '\\n' }}{% endif %}"
                  "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant: {% endif %}")
ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def tok():
    return char_tokenizer()


def ids(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


# -- tool calls ----------------------------------------------------------------------------------

def test_split_tool_calls_takes_out_well_formed_calls_only():
    text = ('Adding.<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'
            '<tool_call>{"name": "mul", "arguments": "{\\"a\\": 3}"}</tool_call>'
            '<tool_call>{"name": add}</tool_call>')
    parsed = split_tool_calls(text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [("add", {"a": 1, "b": 2}), ("mul", {"a": 3})]
    assert parsed.content == 'Adding.<tool_call>{"name": add}</tool_call>'  # the malformed block stays
    assert split_tool_calls("no calls here").content == "no calls here" and not split_tool_calls("x").calls
    only = split_tool_calls('<tool_call>{"name": "f", "arguments": {}}</tool_call>')
    assert only.content is None and only.calls[0].name == "f"


def test_completion_gives_tool_calls_in_openais_format():
    parsed = split_tool_calls('<tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    body = completion("policy", [(parsed, "stop")], prompt_tokens=5, completion_tokens=3)
    choice = body["choices"][0]
    call = choice["message"]["tool_calls"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "add", "arguments": '{"a": 1}'}  # a JSON string, as OpenAI sends it
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}


# -- the session recorder ------------------------------------------------------------------------

def test_a_session_keeps_the_generated_tokens_and_appends_the_new_messages_masked(tok):
    session = Session("s", group_id="s")
    first = [{"role": "user", "content": "hi"}]
    p1 = session.next_prompt(tok, first, None)
    assert p1.prompt == ids(tok, "user: hi\nassistant: ")  # 20 characters, 20 tokens
    # The model said "ok" and stopped: its tokens end with <eos>, which the client never sees.
    said = ids(tok, "ok") + [tok.eos_token_id]
    session.record(p1, Generated(tokens=said, logprobs=[-1.0, -2.0, -3.0], finish_reason="stop", version=0), tok)
    second = first + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "go"}]
    p2 = session.next_prompt(tok, second, None)
    new = ids(tok, "\nuser: go\nassistant: ")
    assert len(new) == 21
    assert p2.prompt == p1.prompt + said + new  # <eos> kept: what the model really produced
    # The trap: re-tokenizing the conversation loses the <eos> the policy generated.
    assert ids(tok, render(tok, second, None)) != p2.prompt
    session.record(p2, Generated(tokens=ids(tok, "no"), logprobs=[-0.5, -0.25], finish_reason="length", version=1), tok)
    # A third turn: the first one's <eos> is still in the recording, not in the template's rendering.
    third = second + [{"role": "assistant", "content": "no"}, {"role": "user", "content": "?"}]
    p3 = session.next_prompt(tok, third, None)
    assert p3.prompt == p2.prompt + ids(tok, "no") + ids(tok, "\nuser: ?\nassistant: ")
    session.record(p3, Generated(tokens=ids(tok, "1"), logprobs=[-0.125], finish_reason="length", version=1), tok)
    t = session.trajectory({"win": 1.0})
    assert t.prompt_tokens == p1.prompt and t.response_tokens == p3.prompt[20:] + ids(tok, "1")
    assert t.loss_mask == [1, 1, 1] + [0] * 21 + [1, 1] + [0] * 20 + [1]
    assert t.logprobs == [-1.0, -2.0, -3.0] + [0.0] * 21 + [-0.5, -0.25] + [0.0] * 20 + [-0.125]
    assert t.finish_reason == "length" and t.metadata["turn_versions"] == [0, 1, 1] and session.policy_version == 0


def test_special_tokens_the_client_never_saw_stay_recorded(tok):
    session = Session("s", group_id="s")
    first = [{"role": "user", "content": "hi"}]
    p1 = session.next_prompt(tok, first, None)
    said = [tok.unk_token_id] + ids(tok, "ok")  # decoded for the client as "ok"
    session.record(p1, Generated(tokens=said, logprobs=[-1.0] * 3, finish_reason="length", version=0), tok)
    p2 = session.next_prompt(tok, first + [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "x"}], None)
    assert p2.prompt == p1.prompt + said + ids(tok, "\nuser: x\nassistant: ")


def test_a_tool_result_is_context_with_mask_0_and_the_call_is_the_models_own_text():
    tok = char_tokenizer()
    tok.chat_template = TOOLS_TEMPLATE
    session = Session("s", group_id="s")
    first = [{"role": "user", "content": "add 2 3"}]
    p1 = session.next_prompt(tok, first, [ADD])
    assert p1.prompt == ids(tok, "tools: add \nuser: add 2 3\nassistant: ")
    call = ids(tok, "<tool_call>add 2 3</tool_call>") + [tok.eos_token_id]
    session.record(p1, Generated(tokens=call, logprobs=[-1.0] * len(call), finish_reason="stop", version=0), tok)
    # The client sends the call back as OpenAI's tool_calls with no content, then the tool's result.
    history = first + [{"role": "assistant", "content": "",
                        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "add", "arguments": {}}}]},
                       {"role": "tool", "content": "5", "tool_call_id": "call_1"}]
    p2 = session.next_prompt(tok, history, [ADD])
    assert p2.prompt == p1.prompt + call + ids(tok, "\ntool: 5\nassistant: ")
    with pytest.raises(SessionMismatch, match="does not continue"):  # other tools: another prompt
        session.next_prompt(tok, history, [ADD, {"type": "function", "function": {"name": "mul"}}])


def test_a_conversation_that_does_not_continue_the_recording_is_refused(tok):
    session = Session("s", group_id="s")
    p1 = session.next_prompt(tok, [{"role": "user", "content": "hi"}], None)
    session.record(p1, Generated(tokens=ids(tok, "ok"), logprobs=[-1.0, -1.0], finish_reason="length", version=0), tok)
    edited = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "x"}]
    with pytest.raises(SessionMismatch, match="does not continue"):
        session.next_prompt(tok, edited, None)
    with pytest.raises(SessionMismatch, match="0 assistant message"):
        session.next_prompt(tok, [{"role": "user", "content": "hi"}], None)
    with pytest.raises(ValueError, match="does not render tools"):
        Session("t", group_id="t").next_prompt(tok, [{"role": "user", "content": "hi"}], [ADD])


# -- the HTTP side: OpenAI's errors, never a crash -----------------------------------------------

@pytest.fixture(scope="module")
def client():
    engine = TransformersEngine(ModelSpec(), seed=0)
    return TestClient(build_app(Endpoint(engine, "policy", SamplingParams(max_new_tokens=4))))


def ask(client, body=None, raw: bytes | None = None, **headers):
    if raw is not None:
        return client.post("/v1/chat/completions", content=raw, headers=headers)
    return client.post("/v1/chat/completions", json=body, headers=headers)


HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("body, status, param, code", [
    (b"{not json", 400, None, None),
    ({"model": "gpt-4o", "messages": HI}, 404, "model", "model_not_found"),
    ({"model": "policy"}, 400, "messages", None),
    ({"model": "policy", "messages": []}, 400, "messages", None),
    ({"model": "policy", "messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role", None),
    ({"model": "policy", "messages": HI, "temperature": 3}, 400, "temperature", None),
    ({"model": "policy", "messages": HI, "stream": "yes"}, 400, "stream", None),
    ({"model": "policy", "messages": HI, "stop": ["\n"]}, 400, "stop", "unsupported_parameter"),
    ({"model": "policy", "messages": HI, "presence_penalty": 0.5}, 400, "presence_penalty", "unsupported_parameter"),
    ({"model": "policy", "messages": [{"role": "user", "content": "x" * 300}]}, 400, "messages",
     "context_length_exceeded"),  # the tiny model has 256 positions
    ({"model": "policy", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, "messages", None),
    ({"model": "policy", "messages": HI, "tools": [ADD]}, 400, "messages", None),  # its template renders no tools
])
def test_bad_requests_get_openais_errors(client, body, status, param, code):
    r = ask(client, raw=body) if isinstance(body, bytes) else ask(client, body)
    error = r.json()["error"]
    assert r.status_code == status and error["param"] == param and error["code"] == code, r.json()
    assert error["type"] == "invalid_request_error" and error["message"]


def test_session_rules_and_unknown_routes_get_openais_errors(client):
    s = {"X-Undertow-Session": "e1"}
    assert ask(client, {"model": "policy", "messages": HI, "temperature": 0.5}, **s).json()["error"]["param"] == "temperature"
    assert ask(client, {"model": "policy", "messages": HI, "n": 2}, **s).json()["error"]["param"] == "n"
    assert ask(client, {"model": "policy", "messages": HI}, **{"X-Undertow-Session": "a b"}).status_code == 400
    assert ask(client, {"model": "policy", "messages": HI}, **s).status_code == 200
    edited = [{"role": "user", "content": "ho"}, {"role": "assistant", "content": "?"}, {"role": "user", "content": "x"}]
    r = ask(client, {"model": "policy", "messages": edited}, **s)
    assert r.status_code == 400 and r.json()["error"]["code"] == "session_history_mismatch"
    assert client.post("/v1/undertow/sessions/e1/reward", json={}).status_code == 400  # neither reward nor components
    nan = client.post("/v1/undertow/sessions/e1/reward", content=b'{"components": {"x": NaN}}')
    assert nan.status_code == 400 and nan.json()["error"]["param"] == "components.x"
    assert client.post("/v1/undertow/sessions/e1/reward", json={"reward": 1}).status_code == 503  # no broker here
    r = client.post("/v1/undertow/sessions/nobody/reward", json={"reward": 1.0})
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_not_found"
    assert client.delete("/v1/undertow/sessions/e1").json() == {"session": "e1", "deleted": True}
    assert client.delete("/v1/undertow/sessions/e1").status_code == 404
    r = client.get("/v1/nothing")
    assert r.status_code == 404 and "Unknown request URL" in r.json()["error"]["message"]
    assert client.get("/v1/chat/completions").status_code == 405
    assert client.get("/v1/models/gpt-4o").status_code == 404
    assert client.get("/v1/models").json()["data"][0]["id"] == "policy"


def test_an_unrecorded_request_samples_n_choices_or_greedy(client):
    r = ask(client, {"model": "policy", "messages": HI, "n": 3, "max_tokens": 2}).json()
    assert len(r["choices"]) == 3 and r["usage"]["prompt_tokens"] == len("user: hi\nassistant: ")
    greedy = [ask(client, {"model": "policy", "messages": HI, "temperature": 0}).json()["choices"][0]["message"]["content"]
              for _ in range(2)]
    assert greedy[0] == greedy[1]
    assert json.loads(client.get("/health").content)["status"] == "ok"


def watched_endpoint() -> tuple[Endpoint, TestClient, list[int]]:
    """An endpoint whose real engine counts overlapping generate() calls (the most at once in [1])."""
    engine = TransformersEngine(ModelSpec(), seed=0)
    endpoint = Endpoint(engine, "policy", SamplingParams(max_new_tokens=3))
    counts = [0, 0]
    generate = engine.generate

    def watched(prompts, n, params):
        counts[0] += 1
        counts[1] = max(counts[1], counts[0])
        time.sleep(0.01)
        try:
            return generate(prompts, n, params)
        finally:
            counts[0] -= 1

    engine.generate = watched
    return endpoint, TestClient(build_app(endpoint)), counts


def test_concurrent_requests_take_turns_on_the_engine_and_each_session_stays_whole():
    endpoint, client, counts = watched_endpoint()
    asked = {}

    def episode(i: int) -> None:
        s, messages = {"X-Undertow-Session": f"c{i}"}, [{"role": "user", "content": f"{i}+1?"}]
        first = ask(client, {"model": "policy", "messages": messages}, **s).json()["choices"][0]["message"]["content"]
        messages += [{"role": "assistant", "content": first}, {"role": "user", "content": "so?"}]
        asked[i] = ask(client, {"model": "policy", "messages": messages}, **s).status_code

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert asked == {i: 200 for i in range(4)} and counts[1] == 1
    for i in range(4):
        session = endpoint._sessions[f"c{i}"]
        prompt = session.prompt_tokens
        assert prompt == ids(endpoint.tokenizer, f"user: {i}+1?\nassistant: ") and len(session.turns) == 2
        first = session.turns[0].tokens
        assert session.tokens[:len(first)] == first and session.mask == [1] * len(first) + [0] * 22 + [1] * len(
            session.turns[1].tokens)  # "\nuser: so?\nassistant: " is 22 characters


def test_two_first_turns_of_one_session_at_once_are_one_turn_and_a_refusal():
    endpoint, client, _ = watched_endpoint()
    start, statuses = threading.Barrier(2), []

    def first_turn() -> None:
        start.wait()
        statuses.append(ask(client, {"model": "policy", "messages": HI}, **{"X-Undertow-Session": "twice"}).status_code)

    threads = [threading.Thread(target=first_turn) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    # The second is no continuation of the first (no assistant message): refused, not recorded over it.
    assert sorted(statuses) == [200, 400] and len(endpoint._sessions["twice"].turns) == 1


def test_a_streamed_answer_is_the_same_answer_in_openais_chunks(client):
    """Through the real `openai` client (over the in-process app): greedy, so both calls answer alike."""
    import openai

    agent = openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=client, max_retries=0)
    whole = agent.chat.completions.create(model="policy", messages=HI, temperature=0)
    chunks = list(agent.chat.completions.create(model="policy", messages=HI, temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].usage.total_tokens == whole.usage.total_tokens


def test_concurrent_openai_requests_share_engine_calls_and_answer_as_serial_greedy_ones():
    """Six agents ask at once through the real `openai` client: the batcher's window gathers them
    into fewer engine calls than requests, and each greedy answer is the one it gets asked alone
    (prompts of different lengths: left padding must not change a row's tokens)."""
    import openai

    engine = TransformersEngine(ModelSpec(), seed=0)
    torch.manual_seed(0)
    with torch.no_grad():  # the fresh tiny model's greedy answer is spaces whatever the prompt: shake it up
        for p in engine.model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    endpoint = Endpoint(engine, "policy", SamplingParams(max_new_tokens=6),
                        settings=ServeConfig(batch_window_s=0.2, max_batch=8))
    agent = openai.OpenAI(base_url="http://testserver/v1", api_key="-", http_client=TestClient(build_app(endpoint)),
                          max_retries=0)
    questions = [[{"role": "user", "content": "q" * (i + 1)}] for i in range(6)]

    def answer(messages):
        reply = agent.chat.completions.create(model="policy", messages=messages, temperature=0)
        return reply.choices[0].message.content, reply.usage.completion_tokens

    start = threading.Barrier(6)

    def at_once(i: int) -> None:
        start.wait()
        together[i] = answer(questions[i])

    together: dict[int, tuple] = {}
    threads = [threading.Thread(target=at_once, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    calls = endpoint.batcher.stats.calls
    assert len(together) == 6 and calls < 6 and endpoint.batcher.stats.requests == 6
    alone = [answer(q) for q in questions]  # one engine call each
    assert endpoint.batcher.stats.calls == calls + 6
    assert [together[i] for i in range(6)] == alone
    assert len({text for text, _ in alone}) > 1  # the prompts really lead to different answers
    endpoint.close()


def test_an_idle_session_expires_unpublished_and_its_reward_is_a_404(caplog):
    endpoint = Endpoint(TransformersEngine(ModelSpec(), seed=0), "policy", SamplingParams(max_new_tokens=2),
                        settings=ServeConfig(session_ttl_s=60))
    client = TestClient(build_app(endpoint))
    for sid in ("idle", "busy", "fresh"):
        assert ask(client, {"model": "policy", "messages": HI}, **{"X-Undertow-Session": sid}).status_code == 200
    now = time.monotonic()
    for sid, idle_s in (("idle", 60.5), ("fresh", 59.5), ("busy", 1000.0)):
        endpoint._sessions[sid].touched = now - idle_s
    endpoint._session_locks["busy"].acquire()  # a turn of it is running: not idle, however old
    assert endpoint.expire_idle(now=now - 1) == [] and endpoint.expired == 0  # "idle" had 59.5 s then
    with caplog.at_level("WARNING"):
        assert endpoint.expire_idle(now=now) == ["idle"] and endpoint.expired == 1
    assert "session idle expired after 60 s idle (1 turn(s)" in caplog.text
    r = client.post("/v1/undertow/sessions/idle/reward", json={"reward": 1.0})
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_expired"
    assert "serve.session_ttl_s = 60 s" in r.json()["error"]["message"]
    # Its next turn would record the rest of the conversation as a new episode's prompt: refused too.
    going_on = HI + [{"role": "assistant", "content": "x"}, {"role": "user", "content": "go"}]
    r = ask(client, {"model": "policy", "messages": going_on}, **{"X-Undertow-Session": "idle"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "session_expired"
    assert client.delete("/v1/undertow/sessions/idle").status_code == 404
    assert client.post("/v1/undertow/sessions/never/reward", json={"reward": 1.0}).json()["error"]["code"] == \
        "session_not_found"
    endpoint._session_locks["busy"].release()
    assert client.get("/health").json()["sessions_open"] == 2  # busy and fresh stay
    # On the real clock: a request sweeps first, so a reward past the TTL finds the session gone.
    endpoint.settings.session_ttl_s = 0.05
    endpoint._sessions["fresh"].touched = time.monotonic() - 0.1  # idle past the TTL (no sleep to bet on)
    assert client.post("/v1/undertow/sessions/fresh/reward", json={"reward": 1.0}).status_code == 404
    assert endpoint.expired == 3 and client.get("/health").json() == {
        "status": "ok", "policy_version": 0, "sessions_open": 0, "sessions_expired": 3}


def test_the_server_keeps_an_idle_connection_longer_than_the_openai_client_does():
    """The client must be the one to drop an idle connection between an agent's turns: when both did
    at the same moment (uvicorn's 5 s, httpx's 5 s) a turn could be sent on one the server was closing."""
    assert server_config(Starlette()).timeout_keep_alive > openai.DEFAULT_CONNECTION_LIMITS.keepalive_expiry
