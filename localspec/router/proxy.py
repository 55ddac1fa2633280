"""The router's hop to a runner: one request forwarded to the runner's own `localspec serve`, its answer relayed
piece by piece at the ASGI level, and a runner that dies mid-answer turned into an error in the caller's protocol.

Why raw ASGI over relay.py's client instead of a FastAPI route over httpx: the hop is on every editor keystroke,
and on 2 cores every layer between the caller's socket and the runner's costs CPU that the runner's llama.cpp
threads want (docs/bench/router.md#router-hop). Connections to a runner are kept alive (relay.Upstreams), so a
forwarded request costs no TCP handshake. Streamed answers (SSE, Ollama's NDJSON) are relayed as they come;
whole answers are read and sent with their length, as the runner sent them.

A caller that hangs up, before the runner answers or during its answer: a watch on the caller's `receive`
(HangUp) closes the upstream connection at once, which the runner's server reads as a disconnect and stops
the generation.

A runner that dies while answering: before its headers (a whole answer, or a stream that had not started) the
caller gets the protocol's error body, 500 under /api/ (Ollama's status) and 502 elsewhere (a bad gateway);
after them (a stream under way) a last event in the stream's own framing: `data: {"error": ...}` (OpenAI,
llama.cpp), `event: error` (Anthropic, Responses), or an `{"error": ...}` line (Ollama). The message names
the cause: supervise.crash_line for a signal death, the exit code and the last stderr line otherwise.
"""

from __future__ import annotations

import asyncio
import json
from typing import Awaitable, Callable, Protocol

from starlette.responses import Response

from ..server.http import error_body
from .relay import Reply, UpstreamBroken, Upstreams

STREAMED = (b"text/event-stream", b"application/x-ndjson")
# hop-by-hop and per-connection headers (RFC 9110 7.6.1), and the ones the router sets itself: Origin stays
# here so the router's CORS middleware alone answers it (a runner would add a second set of headers)
_DROP_REQUEST = {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"origin", b"te",
                 b"upgrade", b"proxy-connection", b"authorization", b"x-api-key", b"expect"}
_DROP_RESPONSE = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"date", b"server"}
OLLAMA_CRASH = "llama runner process has terminated"  # Ollama's words for a runner that died
DEATH_WAIT_S = 3.0  # a runner whose connection broke has this long to be seen dead before the cause is a guess


class Upstream(Protocol):
    """What the proxy needs of a runner (router/runner.py's Runner)."""

    @property
    def url(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    def failure(self) -> str | None: ...

    async def died(self, timeout: float = 2.0) -> str | None: ...


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


def crash_answer(path: str, message: str) -> bytes:
    """A whole HTTP/1.1 answer carrying the protocol's error body for a runner that died before answering,
    written straight to the caller's socket (a handed-over connection, router/handoff.py); the connection
    closes after it."""
    status = crash_status(path)
    body = bytes(error_body(path, status, message, "server_error").body)
    reason = "Internal Server Error" if status == 500 else "Bad Gateway"
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode() + body


async def cause_of_death(runner: Upstream) -> str:
    """Why the connection to `runner` broke: its failure() once the process is seen dead (the socket closes a
    moment before the kernel reports the exit), else a plain statement that the connection was lost."""
    cause = await runner.died(DEATH_WAIT_S)
    if cause:
        return cause
    if runner.alive:
        return "the connection to it was lost (the process is still running)"
    return "it was stopped"


def _request_headers(scope: dict) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in scope["headers"] if k not in _DROP_REQUEST]


def _response_headers(reply: Reply) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in reply.headers if k not in _DROP_RESPONSE]


class Abortable(Protocol):
    def abort(self) -> None: ...


class HangUp:
    """A watch on the caller's `receive`: when the caller disconnects, `target.abort()` closes the upstream
    connection at once (the runner reads that as a disconnect and stops generating). `target` is the request
    in flight, then its reply. llama.vim drops a whole-answer /infill at the next keystroke."""

    def __init__(self, receive: Callable[[], Awaitable[dict]], target: Abortable) -> None:
        self.target = target
        self._task = asyncio.ensure_future(_gone(receive))
        self._task.add_done_callback(self._fire)

    def _fire(self, _: asyncio.Future) -> None:
        self.target.abort()

    @property
    def gone(self) -> bool:
        return self._task.done()

    def close(self) -> None:
        self._task.remove_done_callback(self._fire)
        self._task.cancel()


async def _gone(receive: Callable[[], Awaitable[dict]]) -> None:
    """Returns when the caller disconnects (after the body, the next ASGI message is the disconnect)."""
    while (await receive())["type"] != "http.disconnect":
        pass


def _target(scope: dict) -> str:
    path = scope.get("raw_path") or scope["path"].encode()
    query = scope.get("query_string") or b""
    return (path + b"?" + query if query else path).decode("latin-1")


async def forward(upstreams: Upstreams, scope: dict, receive: Callable, send: Callable, runner: Upstream,
                  body: bytes, model: str, done: Callable[[], None]) -> None:
    """Send the request (its `body` already read) to `runner` and relay the answer to `send`; `done` runs
    once, when the answer has been relayed, failed or was abandoned by the caller (the pool's release).
    The request is written first, before the watch on the caller is made: nothing this process does delays
    the runner's start."""
    path = scope["path"]
    sent = upstreams.send(runner.url, scope["method"], _target(scope), _request_headers(scope), body)
    hang_up = HangUp(receive, sent)
    try:
        try:
            reply = await sent
        except UpstreamBroken:
            done()
            if hang_up.gone:
                return await Response(status_code=499)(scope, receive, send)  # nginx's "client closed request"
            return await _crashed(scope, receive, send, runner, model)
        except BaseException:
            done()
            raise
        hang_up.target = reply
        try:
            if reply.header(b"content-type").startswith(STREAMED):
                await _stream(reply, path, runner, model, hang_up, send)
            else:
                await _whole(reply, path, runner, model, hang_up, scope, receive, send)
        finally:
            try:
                reply.close()
            finally:
                done()
    finally:
        hang_up.close()


class Relayed(Response):
    """`forward` as a Response a FastAPI route can return (the router's GET /props?model=, /metrics)."""

    def __init__(self, upstreams: Upstreams, runner: Upstream, model: str, done: Callable[[], None]) -> None:
        super().__init__()
        self.upstreams, self.runner, self.model, self.done = upstreams, runner, model, done

    async def __call__(self, scope, receive, send) -> None:
        await forward(self.upstreams, scope, receive, send, self.runner, b"", self.model, self.done)


async def _crashed(scope: dict, receive: Callable, send: Callable, runner: Upstream, model: str) -> None:
    """The answer to a caller whose runner died before its answer began: the protocol's error body."""
    path = scope["path"]
    body = error_body(path, crash_status(path), crash_message(path, model, await cause_of_death(runner)),
                      "server_error")
    await body(scope, receive, send)


async def _whole(reply: Reply, path: str, runner: Upstream, model: str, hang_up: HangUp, scope: dict,
                 receive: Callable, send: Callable) -> None:
    """A whole answer, read and sent with its length (so the caller's keep-alive connection stays simple)."""
    try:
        data = await reply.read()
    except UpstreamBroken:
        if hang_up.gone:
            return
        return await _crashed(scope, receive, send, runner, model)
    headers = _response_headers(reply) + [(b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _stream(reply: Reply, path: str, runner: Upstream, model: str, hang_up: HangUp,
                  send: Callable) -> None:
    """The stream's pieces as they come; a broken stream ends with one error event. A caller that hangs up
    closes the upstream connection at once (`hang_up`), which ends the loop. The head goes out with the first
    piece: a runner sends its head a moment before its first event, and on a machine whose cores the
    runner's threads fill, each wake-up of this process delays the runner's next write."""
    head = {"type": "http.response.start", "status": reply.status, "headers": _response_headers(reply)}
    started = False

    async def out(body: bytes, more: bool = True) -> None:
        nonlocal started
        if not started:
            started = True
            await send(head)
        await send({"type": "http.response.body", "body": body, "more_body": more})

    try:
        async for piece in reply.pieces():
            await out(piece)
    except UpstreamBroken:
        if not hang_up.gone:  # the runner broke it, not the caller
            await out(error_event(path, 500, crash_message(path, model, await cause_of_death(runner))))
    await out(b"", more=False)
