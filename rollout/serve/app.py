"""The HTTP side: OpenAI's routes on Starlette, served by uvicorn.

Every handler answers JSON; an `ApiError` becomes its status and OpenAI's error object, a body that
is not JSON a 400, an unknown route a 404, and anything unexpected a 500 `server_error` (logged):
a bad request never takes the server down. The engine runs in Starlette's thread pool, so the
event loop keeps accepting requests while one generates (the endpoint serializes engine calls).
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from undertow.rollout.serve.endpoint import Endpoint
from undertow.rollout.serve.keys import KeyCheck
from undertow.rollout.serve.protocol import ApiError, stream_events

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)
Handler = Callable[[Request], Awaitable[Response]]


def build_app(endpoint: Endpoint, keys: frozenset[str] = frozenset()) -> Starlette:
    """The ASGI app over `endpoint`: /v1/models, /v1/chat/completions and the session routes; with
    `keys`, each of those needs one of them as a bearer token (/health stays open for probes)."""
    check = KeyCheck(keys)

    async def chat(request: Request) -> Any:
        body = await _json(request)
        answer = await run_in_threadpool(endpoint.chat, body, request.headers)
        if body.get("stream") is True:  # validated by endpoint.chat: a strict bool, options a dict of them
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(iter(stream_events(answer, usage)), media_type="text/event-stream")
        return answer

    async def reward(request: Request) -> Any:
        return await run_in_threadpool(endpoint.reward, request.path_params["session_id"], await _json(request))

    async def drop(request: Request) -> Any:
        return await run_in_threadpool(endpoint.drop, request.path_params["session_id"])

    async def models(request: Request) -> Any:
        return endpoint.models()

    async def model(request: Request) -> Any:
        return endpoint.model_card(request.path_params["model"])

    async def health(request: Request) -> Any:
        return {"status": "ok", "policy_version": endpoint.version, "sessions_open": endpoint.sessions_open,
                "sessions_expired": endpoint.expired}

    routes = [Route("/v1/chat/completions", _api(chat, check), methods=["POST"]),
              Route("/v1/models", _api(models, check), methods=["GET"]),
              Route("/v1/models/{model:path}", _api(model, check), methods=["GET"]),
              Route("/v1/undertow/sessions/{session_id}/reward", _api(reward, check), methods=["POST"]),
              Route("/v1/undertow/sessions/{session_id}", _api(drop, check), methods=["DELETE"]),
              Route("/health", _api(health), methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={HTTPException: _http_error})


def _api(handler: Callable[[Request], Awaitable[Any]], check: KeyCheck | None = None) -> Handler:
    """`handler`'s dict as JSON; its errors as OpenAI's error objects; with `check` requiring keys, a
    request without a valid one is a 401 before anything else is read."""

    async def wrapped(request: Request) -> Response:
        try:
            if check is not None and check.required and not check.allows(request.headers.get("authorization")):
                raise ApiError(401, "Missing or invalid API key: send `Authorization: Bearer KEY` with one of the "
                                    "keys serve.api_keys points at.", code="invalid_api_key")
            answer = await handler(request)
            return answer if isinstance(answer, Response) else JSONResponse(answer)
        except ApiError as e:
            return JSONResponse(e.body(), status_code=e.status)
        except Exception as e:  # the server stays up; the client learns it was ours
            log.exception("%s %s failed", request.method, request.url.path)
            error = ApiError(500, f"{type(e).__name__}: {e}", type="server_error")
            return JSONResponse(error.body(), status_code=500)

    return wrapped


async def _json(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(400, f"We could not parse the JSON body of your request: {e}") from None


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Routing's own errors (unknown path 404, wrong method 405) in OpenAI's shape."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    message = f"Unknown request URL: {request.method} {request.url.path}" if status == 404 else str(
        getattr(exc, "detail", exc))
    return JSONResponse(ApiError(status, message).body(), status_code=status)


# An agent's connection idles between its turns while it thinks or runs a tool. The server must keep it
# longer than any client's pool does (httpx, hence the openai client: 5 s), so that the client is the one
# to drop it: at uvicorn's own 5 s both closed it at once, and a turn sent on a connection the server was
# closing failed with a connection error (seen: one of 200 agents whose others took 5 s to answer).
KEEP_ALIVE_S = 75


def server_config(app: Starlette, **kw: Any) -> "uvicorn.Config":
    """uvicorn's settings for the endpoint's app (`kw`: host, port, log_level)."""
    import uvicorn

    return uvicorn.Config(app, timeout_keep_alive=KEEP_ALIVE_S, **kw)


def serve(endpoint: Endpoint, host: str = "127.0.0.1", port: int = 8000, keys: frozenset[str] = frozenset()) -> None:
    """Serve until SIGINT / SIGTERM, following the weights topic meanwhile; then close the endpoint."""
    import uvicorn

    if threading.current_thread() is threading.main_thread():
        # uvicorn shuts down gracefully on the signal, then raises it again into the handler it found:
        # this one lets the process go on to close the producer and the subscriber, and exit 0.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
    endpoint.start()
    try:
        uvicorn.Server(server_config(build_app(endpoint, keys), host=host, port=port, log_level="info")).run()
    finally:
        endpoint.close()
