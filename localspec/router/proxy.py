"""The router's hop to a runner: a request forwarded to the runner's own `localspec serve` through one pooled
keep-alive HTTP client (aiohttp's), its answer passed on as it comes, and a runner that dies mid-answer turned
into an error in the caller's protocol.

Why a plain proxy: llama.cpp's router and Ollama's server forward the same way, and the hop costs about a
millisecond of a 100 ms editor request on a 2-core machine (docs/bench/router.md). Why aiohttp's client: it is
maintained, it parses HTTP in C, and it keeps connections to each runner alive, so a request pays no TCP
handshake. Streamed answers (SSE, Ollama's NDJSON) are passed on piece by piece; whole answers are read and
sent with their length.

A caller that hangs up, before the runner answers or during its answer: a watch on the caller's `receive`
(HangUp) closes the connection to the runner at once, which the runner's server reads as a disconnect, and it
stops the generation.

A runner that dies while answering: before its head (a whole answer, or a stream that had not started) the
caller gets the protocol's error body, 500 under /api/ (Ollama's status) and 502 elsewhere (a bad gateway);
after it (a stream under way) a last event in the stream's own framing: `data: {"error": ...}` (OpenAI,
llama.cpp), `event: error` (Anthropic, Responses), or an `{"error": ...}` line (Ollama). The message names the
cause: the crash line for a signal death, the exit code and the last line it printed otherwise.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable, Protocol

import aiohttp
from starlette.responses import Response

from ..server.http import error_body

STREAMED = ("text/event-stream", "application/x-ndjson")
# hop-by-hop and per-connection headers (RFC 9110 7.6.1), and the ones the router sets itself: Origin stays
# here so the router's CORS middleware alone answers it (a runner would add a second set of headers)
_DROP_REQUEST = {b"host", b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"origin", b"te",
                 b"upgrade", b"proxy-connection", b"authorization", b"x-api-key", b"expect"}
_DROP_RESPONSE = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"date", b"server"}
OLLAMA_CRASH = "llama runner process has terminated"  # Ollama's words for a runner that died
DEATH_WAIT_S = 3.0  # a runner whose connection broke has this long to be seen dead before the cause is a guess
IDLE_S = 4.0  # an idle connection is dropped before uvicorn's keep-alive timeout (5 s) closes it from the other end
BROKEN = (aiohttp.ClientError, OSError)  # the connection to the runner failed, or closed before the answer's end


class Upstream(Protocol):
    """What the proxy needs of a runner (router/process.py's Runner)."""

    @property
    def url(self) -> str: ...

    @property
    def alive(self) -> bool: ...

    def failure(self) -> str | None: ...

    async def died(self, timeout: float = 2.0) -> str | None: ...


class Client:
    """The router's one HTTP client to its runners: aiohttp's session, made on first use on the running loop."""

    def __init__(self) -> None:
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=IDLE_S, use_dns_cache=False)
            # no total timeout: a generation may run for minutes; the runner is on this machine
            self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False,
                                                  timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
                                                  skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"))
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


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


class HangUp:
    """A watch on the caller's `receive`: when the caller disconnects, `abort` runs at once. It is the request in
    flight's cancel, then the answer's close; either closes the connection to the runner, which the runner reads
    as a disconnect and stops generating. llama.vim drops a whole-answer /infill at the next keystroke."""

    def __init__(self, receive: Callable[[], Awaitable[dict]], abort: Callable[[], Any]) -> None:
        self.abort = abort
        self._task = asyncio.ensure_future(_gone(receive))
        self._task.add_done_callback(self._fire)

    def _fire(self, _: asyncio.Future) -> None:
        self.abort()

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


def _request_headers(scope: dict, runner: Upstream) -> list[tuple[str, str]]:
    """The caller's headers less the hop's own and its key, and the runner's secret (router/process.py)."""
    headers = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in scope["headers"] if k not in _DROP_REQUEST]
    secret = getattr(runner, "secret", None)
    return headers + [("Authorization", f"Bearer {secret}")] if secret else headers


def _response_headers(reply: aiohttp.ClientResponse) -> list[tuple[bytes, bytes]]:
    return [(k.lower(), v) for k, v in reply.raw_headers if k.lower() not in _DROP_RESPONSE]


async def forward(client: Client, scope: dict, receive: Callable, send: Callable, runner: Upstream,
                  body: bytes, model: str, done: Callable[[], None]) -> None:
    """Send the request (its `body` already read) to `runner` and pass the answer on to `send`; `done` runs
    once, when the answer has been passed on, failed or was abandoned by the caller (the pool's release)."""
    path = scope["path"]
    sent = asyncio.ensure_future(client.session.request(
        scope["method"], runner.url + _target(scope), headers=_request_headers(scope, runner), data=body))
    hang_up = HangUp(receive, sent.cancel)
    try:
        try:
            reply = await sent
        except (asyncio.CancelledError, *BROKEN):
            if not hang_up.gone and sent.cancelled():
                raise  # this task was cancelled, not the request
            if hang_up.gone:
                return await Response(status_code=499)(scope, receive, send)  # nginx's "client closed request"
            return await _crashed(scope, receive, send, runner, model)
        hang_up.abort = reply.close
        try:
            if reply.content_type in STREAMED:
                await _stream(reply, path, runner, model, hang_up, send)
            else:
                await _whole(reply, runner, model, hang_up, scope, receive, send)
        except BaseException:
            reply.close()  # the answer was not read to its end: its connection cannot be used again
            raise
        reply.release()  # back to the pool (aiohttp closes a connection whose answer did not end)
    finally:
        hang_up.close()
        done()


class Relayed(Response):
    """`forward` as a Response a FastAPI route can return (the router's GET /props?model=, /metrics)."""

    def __init__(self, client: Client, runner: Upstream, model: str, done: Callable[[], None]) -> None:
        super().__init__()
        self.client, self.runner, self.model, self.done = client, runner, model, done

    async def __call__(self, scope, receive, send) -> None:
        await forward(self.client, scope, receive, send, self.runner, b"", self.model, self.done)


async def _crashed(scope: dict, receive: Callable, send: Callable, runner: Upstream, model: str) -> None:
    """The answer to a caller whose runner died before its answer began: the protocol's error body."""
    path = scope["path"]
    body = error_body(path, crash_status(path), crash_message(path, model, await cause_of_death(runner)),
                      "server_error")
    await body(scope, receive, send)


async def _whole(reply: aiohttp.ClientResponse, runner: Upstream, model: str, hang_up: HangUp, scope: dict,
                 receive: Callable, send: Callable) -> None:
    """A whole answer, read and sent with its length (so the caller's keep-alive connection stays simple)."""
    try:
        data = await reply.read()
    except BROKEN:
        if hang_up.gone:
            return
        return await _crashed(scope, receive, send, runner, model)
    headers = _response_headers(reply) + [(b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


async def _stream(reply: aiohttp.ClientResponse, path: str, runner: Upstream, model: str, hang_up: HangUp,
                  send: Callable) -> None:
    """The stream's pieces as they come (those that arrived together as one); a broken stream ends with one error
    event. A caller that hangs up closes the connection to the runner at once (`hang_up`), which ends the loop."""
    await send({"type": "http.response.start", "status": reply.status, "headers": _response_headers(reply)})
    try:
        async for piece in reply.content.iter_any():
            await send({"type": "http.response.body", "body": piece, "more_body": True})
    except BROKEN:
        if not hang_up.gone:  # the runner broke it, not the caller
            event = error_event(path, 500, crash_message(path, model, await cause_of_death(runner)))
            await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
