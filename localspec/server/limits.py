"""What one connection may cost the server before its request is whole: how long its head may take, how large
its body may be, and how long the body may pause.

Why: a server left running all day beside an editor must not be held by a client that never finishes its
request. uvicorn times out only an idle keep-alive connection after an answer (5 s), not one that is sending
its head; fifty connections that sent part of their headers stayed open for minutes, one descriptor each. And a
50 MB body took the process from 345 MB to 5.4 GB before any route had looked at it.

The limits and their conventions (docs/server.md#limits): a request's head must arrive whole within
HEAD_TIMEOUT_S of the connection's opening or of the previous answer's end (nginx's client_header_timeout, at
uvicorn's scale), else the connection is closed; a body may pause at most BODY_TIMEOUT_S between two reads
(llama-server's --timeout reads the same way, per read) else the answer is 408; a body larger than
MAX_BODY_BYTES is a 413 (cpp-httplib's and nginx's status), refused from its Content-Length before it is read
when it sends one.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from .http import error_body

HEAD_TIMEOUT_S = 10.0
BODY_TIMEOUT_S = 60.0
MAX_BODY_BYTES = 16 * 1024 * 1024  # 16 MiB: a 200k-token chat with its tools is about 1 MB of JSON
BODY_ENV = "LOCALSPEC_MAX_BODY_BYTES"  # another limit, for a client that truly sends more


def max_body_bytes() -> int:
    value = os.environ.get(BODY_ENV, "")
    return int(value) if value.isdigit() else MAX_BODY_BYTES


class BodyLimitMiddleware:
    """Reads a request's body before the app sees it, at most `limit` bytes with at most `timeout` seconds
    between two pieces, and hands it to the app whole; answers 413 or 408 in the route's error shape otherwise.
    Messages after the body (a disconnect) pass through, so a route still sees its client hang up."""

    def __init__(self, app: Any, limit: int | None = None, timeout: float = BODY_TIMEOUT_S) -> None:
        self.app = app
        self.limit = max_body_bytes() if limit is None else limit
        self.timeout = timeout

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            return await self.app(scope, receive, send)
        path = scope["path"]
        length = dict(scope.get("headers", [])).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            return await self._refuse(scope, receive, send, 413, self._too_large(int(length)))
        pieces: list[bytes] = []
        size, more = 0, True
        while more:
            try:
                message = await asyncio.wait_for(receive(), self.timeout)
            except asyncio.TimeoutError:
                return await self._refuse(scope, receive, send, 408, f"the request body paused more than "
                                          f"{self.timeout:.0f} s between two reads")
            if message["type"] != "http.request":  # the client left: the route hears it from `receive` alone
                return None
            piece = message.get("body", b"")
            size += len(piece)
            if size > self.limit:
                return await self._refuse(scope, receive, send, 413, self._too_large(size, "more than "))
            pieces.append(piece)
            more = message.get("more_body", False)
        body = b"".join(pieces)
        given = False

        async def replay() -> dict:
            nonlocal given
            if not given:
                given = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        del pieces, path
        await self.app(scope, replay, send)

    def _too_large(self, size: int, prefix: str = "") -> str:
        return (f"the request body is {prefix}{size} bytes: at most {self.limit} ({BODY_ENV} sets another "
                "limit)")

    @staticmethod
    async def _refuse(scope: dict, receive: Any, send: Any, status: int, message: str) -> None:
        kind = "request_too_large" if status == 413 else "invalid_request_error"
        resp = error_body(scope["path"], status, message, kind)
        resp.headers["connection"] = "close"  # the rest of the body is not read: the connection cannot go on
        await resp(scope, receive, send)


def timed_protocol(base: type) -> type:
    """uvicorn's HTTP protocol class `base` with a deadline on each request's head (HEAD_TIMEOUT_S): the
    connection is closed when no request began within it, from the connection's opening or the last answer's
    end. Works on uvicorn's h11 and httptools protocols alike, through what both keep: `cycle` (the request
    under way), `on_response_complete`, `transport` and `loop`."""

    class Timed(base):
        head_timeout = HEAD_TIMEOUT_S

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm_head_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_head_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            handle = getattr(self, "_head_timer", None)
            if handle is not None:
                handle.cancel()
            super().connection_lost(exc)

        def _arm_head_timer(self) -> None:
            old = getattr(self, "_head_timer", None)
            if old is not None:
                old.cancel()
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_late, self.cycle)

        def _head_late(self, cycle: Any) -> None:
            """No new request began since the timer was armed: close, unless an answer is still under way."""
            self._head_timer = None
            if self.cycle is not cycle or self.transport.is_closing():
                return
            if cycle is not None and not cycle.response_complete:
                return
            self.transport.close()

    Timed.__name__ = Timed.__qualname__ = f"Timed{base.__name__}"
    return Timed


def uvicorn_config(app: Any, **options: Any) -> Any:
    """uvicorn's Config for `app` with the head deadline above on the HTTP protocol uvicorn picks by itself
    (httptools where it is installed, else h11)."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    return uvicorn.Config(app, http=timed_protocol(AutoHTTPProtocol), **options)
