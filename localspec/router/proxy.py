"""The router's hop to a runner: one request forwarded to the runner's own `localspec serve`, its answer relayed
byte for byte, and a runner that dies mid-answer turned into an error in the caller's protocol.

Why one shared `httpx.AsyncClient`: its keep-alive pool keeps a connection per runner open, so a forwarded
request costs no TCP handshake (an editor's keystroke waits on this hop). Its idle connections expire before
uvicorn's keep-alive timeout (5 s) closes them from the other end, so the client never writes into a closed
socket. Streamed answers (SSE, Ollama's NDJSON) are relayed chunk by chunk; whole answers are read and sent
with their length, as the runner sent them.

A runner that dies while answering: before its headers (a whole answer, or a stream that had not started) the
caller gets the protocol's error body, 500 under /api/ (Ollama's status) and 502 elsewhere (a bad gateway);
after them (a stream under way) a last event in the stream's own framing: `data: {"error": ...}` (OpenAI,
llama.cpp), `event: error` (Anthropic, Responses), or an `{"error": ...}` line (Ollama). The message names
the cause: supervise.crash_line for a signal death, the exit code and the last stderr line otherwise.
"""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator, Awaitable, Callable, Protocol, TypeVar

import httpx
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from ..server.http import error_body

STREAMED = ("text/event-stream", "application/x-ndjson")
# hop-by-hop and per-connection headers (RFC 9110 7.6.1), and the ones the router sets itself: Origin stays
# here so the router's CORS middleware alone answers it (a runner would add a second set of headers)
_DROP_REQUEST = {"host", "connection", "keep-alive", "transfer-encoding", "content-length", "origin", "te",
                 "upgrade", "proxy-connection", "authorization", "x-api-key"}
_DROP_RESPONSE = {"connection", "keep-alive", "transfer-encoding", "content-length", "date", "server"}
OLLAMA_CRASH = "llama runner process has terminated"  # Ollama's words for a runner that died
T = TypeVar("T")
DEATH_WAIT_S = 3.0  # a runner whose connection broke has this long to be seen dead before the cause is a guess


class Upstream(Protocol):
    """What the proxy needs of a runner (router/runner.py's Runner)."""

    @property
    def url(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    def failure(self) -> str | None: ...

    async def died(self, timeout: float = 2.0) -> str | None: ...


def new_client() -> httpx.AsyncClient:
    """The one client every forwarded request shares (see the module docstring)."""
    return httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0), trust_env=False,
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=64,
                                                 keepalive_expiry=4.0))


def protocol_of(path: str) -> str:
    """Which protocol's error framing a path uses: ollama, anthropic, responses or openai (llama.cpp too)."""
    if path.startswith("/api/"):
        return "ollama"
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1/responses"):
        return "responses"
    return "openai"


def crash_message(path: str, model: str, cause: str) -> str:
    """The one line a caller reads when the runner of `model` died; Ollama's clients know Ollama's words."""
    if protocol_of(path) == "ollama":
        return f"{OLLAMA_CRASH}: {cause}"
    return f"the runner process of model '{model}' terminated: {cause}"


def crash_status(path: str) -> int:
    return 500 if protocol_of(path) == "ollama" else 502


def error_event(path: str, status: int, message: str) -> bytes:
    """A last stream event carrying an error, in the stream's framing; the body is error_body's for the path."""
    body = json.loads(bytes(error_body(path, status, message, "server_error").body))
    kind = protocol_of(path)
    if kind == "ollama":
        return json.dumps(body).encode() + b"\n"
    if kind == "anthropic":  # error_body gives the path Anthropic's shape; the event is {"type": "error", "error"}
        return b"event: error\ndata: " + json.dumps({"type": "error", "error": body["error"]}).encode() + b"\n\n"
    if kind == "responses":
        err = body.get("error", {})
        event = {"type": "error", "code": err.get("type"), "message": err.get("message", message), "param": None}
        return b"event: error\ndata: " + json.dumps(event).encode() + b"\n\n"
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def cause_of_death(runner: Upstream) -> str:
    """Why the connection to `runner` broke: its failure() once the process is seen dead (the socket closes a
    moment before the kernel reports the exit), else a plain statement that the connection was lost."""
    cause = await runner.died(DEATH_WAIT_S)
    if cause:
        return cause
    if runner.alive:
        return "the connection to it was lost (the process is still running)"
    return "it was stopped"


def _request_headers(request: Request) -> list[tuple[str, str]]:
    return [(k, v) for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST]


def _response_headers(resp: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.lower() not in _DROP_RESPONSE}


class CallerGone(Exception):
    """The caller hung up before the answer came: the upstream request was cancelled."""


async def _gone(request: Request) -> None:
    """Returns when the caller disconnects (after the body, the next ASGI message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def unless_gone(request: Request, work: Awaitable[T]) -> T:
    """`work`, cancelled if the caller hangs up first (CallerGone): cancelling an httpx request closes its
    connection, which the runner's server reads as a disconnect and stops the generation (llama.vim drops a
    whole-answer /infill at the next keystroke; the runner must not go on with it)."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_gone(request))
    try:
        finished, _ = await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
    if task in finished:
        return task.result()
    raise CallerGone


async def forward(client: httpx.AsyncClient, request: Request, runner: Upstream, body: bytes, model: str,
                  done: Callable[[], None]) -> Response:
    """Send `request` (its `body` already read) to `runner` and relay the answer; `done` runs once, when the
    answer has been relayed, failed or was abandoned by the caller (the pool's release)."""
    path = request.url.path
    url = runner.url + path + (f"?{request.url.query}" if request.url.query else "")
    upstream = client.build_request(request.method, url, headers=_request_headers(request), content=body)
    try:
        resp = await unless_gone(request, client.send(upstream, stream=True))
    except httpx.TransportError:
        done()
        return error_body(path, crash_status(path), crash_message(path, model, await cause_of_death(runner)),
                          "server_error")
    except CallerGone:
        done()
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it, the log does
    except BaseException:
        done()
        raise
    if not resp.headers.get("content-type", "").startswith(STREAMED):
        return await _whole(request, resp, runner, model, done)
    return StreamingResponse(_relay(resp, path, runner, model, done), status_code=resp.status_code,
                             headers=_response_headers(resp))


async def _whole(request: Request, resp: httpx.Response, runner: Upstream, model: str,
                 done: Callable[[], None]) -> Response:
    """A whole answer, read and sent with its length (so the caller's keep-alive connection stays simple). The
    runner sends a whole answer's body with its headers, so the read needs no watch for a caller that left."""
    path = request.url.path
    try:
        data = await resp.aread()
    except httpx.TransportError:
        return error_body(path, crash_status(path), crash_message(path, model, await cause_of_death(runner)),
                          "server_error")
    finally:
        try:
            await resp.aclose()
        finally:
            done()
    return Response(data, status_code=resp.status_code, headers=_response_headers(resp))


async def _relay(resp: httpx.Response, path: str, runner: Upstream, model: str,
                 done: Callable[[], None]) -> AsyncIterator[bytes]:
    """The stream's bytes as they come; a broken stream ends with one error event. When the caller hangs up,
    Starlette cancels this generator and the `finally` closes the upstream connection, which the runner's
    server reads as a disconnect and cancels the generation."""
    try:
        async for chunk in resp.aiter_raw():
            yield chunk
    except httpx.TransportError:
        yield error_event(path, 500, crash_message(path, model, await cause_of_death(runner)))
    finally:
        try:
            await resp.aclose()
        finally:
            done()
