"""OpenAI's chat completion wire format: the request body, the response, and the error object.

Only what the engine can honour is accepted: a parameter that would change the sampling in a way
the engine cannot do (stop sequences, penalties, streaming) is refused with a 400 naming it, as
OpenAI refuses a bad argument, rather than ignored. `stream: true` gets the answer as server-sent
`chat.completion.chunk` events: one delta per choice (the engine returns whole answers). Other fields OpenAI clients send (`user`,
`metadata`, `seed`, `parallel_tool_calls`, ...) are accepted and have no effect.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError

from undertow.rollout.serve.tool_calls import ParsedOutput


class ApiError(Exception):
    """An error the endpoint answers with: HTTP `status` and OpenAI's `{"error": {...}}` body."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(e: ValidationError) -> ApiError:
    """A 400 naming the first field of the body that failed validation."""
    first = e.errors()[0]
    param = ".".join(str(p) for p in first["loc"]) or None
    return ApiError(400, f"Invalid value for '{param}': {first['msg']}" if param else first["msg"], param=param)


class Message(BaseModel):
    """One chat message; `content` a string or a list of text parts."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None

    def for_template(self) -> dict[str, Any]:
        """The message as Hugging Face chat templates read it (`developer` is a system message there;
        a call's arguments an object, as Hermes templates render them with `tojson`)."""
        out: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role,
                               "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [_template_call(c) for c in self.tool_calls]
        return out

    def text(self) -> str:
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        parts = []
        for i, part in enumerate(self.content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ApiError(400, f"content part {i} of a {self.role} message: only text parts are supported",
                               param="messages")
            parts.append(part["text"])
        return "".join(parts)


def _template_call(call: dict[str, Any]) -> dict[str, Any]:
    function = dict(call.get("function") or {})
    if isinstance(function.get("arguments"), str):
        try:
            function["arguments"] = json.loads(function["arguments"])
        except json.JSONDecodeError:
            pass  # rendered as the string the client sent
    return {**call, "function": function}


UNSUPPORTED = {"stop": "stop sequences", "frequency_penalty": "frequency_penalty",
               "presence_penalty": "presence_penalty", "logit_bias": "logit_bias"}


class ChatRequest(BaseModel):
    """The body of `POST /v1/chat/completions`."""

    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[Message] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none"] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=16)
    stream: StrictBool = False
    stream_options: dict[str, StrictBool] | None = None

    def refuse_unsupported(self) -> None:
        """A 400 for a parameter set to something the engine cannot do."""
        extra = self.model_extra or {}
        for name, what in UNSUPPORTED.items():
            if extra.get(name) not in (None, False, 0, 0.0, [], {}, ""):
                raise ApiError(400, f"{what} is not supported by this endpoint", param=name,
                               code="unsupported_parameter")

    def template_messages(self) -> list[dict[str, Any]]:
        return [m.for_template() for m in self.messages]

    def rendered_tools(self) -> list[dict[str, Any]] | None:
        return None if self.tool_choice == "none" else self.tools or None


def completion(model: str, choices: list[tuple[ParsedOutput, str]], prompt_tokens: int,
               completion_tokens: int) -> dict[str, Any]:
    """A `chat.completion` object: one choice per (parsed output, finish reason)."""
    out = []
    for i, (parsed, finish) in enumerate(choices):
        message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.calls:
            message["tool_calls"] = [c.openai() for c in parsed.calls]
            finish = "tool_calls" if finish == "stop" else finish
        out.append({"index": i, "message": message, "finish_reason": finish, "logprobs": None})
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": model, "choices": out,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}


def stream_events(answer: dict[str, Any], include_usage: bool = False) -> list[str]:
    """`answer` (a `chat.completion`) as the server-sent events of a streamed one: per choice its
    whole message as one delta, then its finish reason; the usage when asked; then `[DONE]`."""
    head = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"],
            "model": answer["model"]}
    events = []
    for choice in answer["choices"]:
        message = choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        events.append({**head, "choices": [{"index": choice["index"], "delta": delta, "finish_reason": None}]})
        events.append({**head, "choices": [{"index": choice["index"], "delta": {},
                                            "finish_reason": choice["finish_reason"]}]})
    if include_usage:
        events.append({**head, "choices": [], "usage": answer["usage"]})
    return [f"data: {json.dumps(e)}\n\n" for e in events] + ["data: [DONE]\n\n"]
