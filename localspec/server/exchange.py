"""The caller's socket in a runner that answers on it (server/handoff.py), and one request's answer written there
as HTTP/1.1: the ASGI `receive` and `send` uvicorn would give the app, with uvicorn's flow control, its framing
(chunked, or by length) and its hang-up detection, and the progress byte the router reads after a crash
(channel.py's page).
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import socket
import time
from http import HTTPStatus
from typing import Any, Awaitable, Callable

from . import channel as wire
from .channel import chunk, received

WRITE_HIGH = 1 << 16  # a caller that reads slower than this buffers makes the app wait (as uvicorn's flow control)
log = logging.getLogger("localspec.server")
Asgi = Callable[[Any, Any, Any], Awaitable[None]]


def keeps_alive(scope: dict) -> bool:
    """HTTP/1.1 keeps the connection unless the caller says close; 1.0 closes unless it says keep-alive."""
    value = next((v for k, v in scope["headers"] if k == b"connection"), b"").lower()
    if scope["http_version"] == "1.0":
        return b"keep-alive" in value
    return b"close" not in value


class Caller:
    """The caller's socket while this runner answers on it. No asyncio transport (making one costs a loop
    iteration before the app may start): writes go straight to the socket, a writer callback takes the rest only
    when the caller reads slowly (and holds the app past WRITE_HIGH, as uvicorn's flow control), and a reader
    notes a hang-up, or keeps what the caller sends after its request, the router's to read, and stops."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self.sock, self.loop, self.fd = sock, loop, sock.fileno()
        sock.setblocking(False)
        self.gone = False
        self.extra = bytearray()
        self.over = asyncio.Event()  # the caller left, or the answer is complete: `receive` says disconnect
        self.writable = asyncio.Event()
        self.writable.set()
        self.heard = asyncio.Event()  # the caller wrote again, or left
        self.given_back = False  # the Adopter gave the connection back while a task waited on it
        self.noticed: Callable[[], None] | None = None  # called when the caller's bytes arrive
        self._out = bytearray()
        self._reading = True
        loop.add_reader(self.fd, self._readable)

    def _readable(self) -> None:
        data = received(self.sock)
        if data is None:
            return
        if not data:
            return self._left()
        self.extra += data
        if self.noticed is not None:
            self.noticed()
        self.heard.set()
        self._stop_reading()

    def write(self, data: bytes) -> None:
        if self.gone:
            return
        if not self._out:
            try:
                sent = self.sock.send(data)
            except (BlockingIOError, InterruptedError):
                sent = 0
            except OSError:
                return self._left()
            if sent == len(data):
                return
            data = data[sent:]
            self.loop.add_writer(self.fd, self._flush)
        self._out += data
        if len(self._out) > WRITE_HIGH:
            self.writable.clear()

    def _flush(self) -> None:
        try:
            sent = self.sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            return self._left()
        del self._out[:sent]
        if not self._out:
            self.loop.remove_writer(self.fd)
        if len(self._out) <= WRITE_HIGH // 4:
            self.writable.set()

    def _stop_reading(self) -> None:
        if self._reading:
            self._reading = False
            self.loop.remove_reader(self.fd)

    def _left(self) -> None:
        self.gone = True
        self.heard.set()
        self._stop_reading()
        self.loop.remove_writer(self.fd)
        self._out.clear()
        self.over.set()
        self.writable.set()

    async def hear(self, seconds: float) -> bool:
        """Read the caller again and wait up to `seconds` for its next bytes (or its leaving): False if none."""
        self.heard.clear()
        if not self._reading and not self.gone:
            self._reading = True
            self.loop.add_reader(self.fd, self._readable)
        try:
            await asyncio.wait_for(self.heard.wait(), seconds)
        except asyncio.TimeoutError:
            self._stop_reading()
            return False
        return True

    def again(self) -> None:
        """A new request on the same connection: the app's `receive` waits for the caller to leave again, and the
        answer's end for the caller's next bytes."""
        self.extra.clear()
        self.heard.clear()
        if not self.gone:
            self.over.clear()
        if not self._reading and not self.gone:
            self._reading = True
            self.loop.add_reader(self.fd, self._readable)

    async def settle(self, seconds: float) -> None:
        """Wait up to `seconds` for the caller's next bytes: the router, woken the moment the answer ends, would
        take a core from the caller reading that answer's last bytes (and from the model's threads still
        spinning); a caller that writes at once is not kept waiting."""
        if not self.heard.is_set():
            try:
                await asyncio.wait_for(self.heard.wait(), seconds)
            except asyncio.TimeoutError:
                pass

    def give_back(self) -> bytes:
        """At once, while a task waits on `hear`: stop reading, close this process's hold on the socket, and wake
        the task (`given_back`); the caller's bytes so far, for the router."""
        self.given_back = True
        self.heard.set()
        self._stop_reading()
        self.sock.close()
        return bytes(self.extra)

    async def release(self) -> bytes:
        """Stop reading, let what was written leave this process, and close this process's hold on the socket
        (the router's own stays open: no FIN): the caller's further bytes, for the router."""
        self._stop_reading()
        if self.sock.fileno() < 0:
            return bytes(self.extra)
        deadline = time.monotonic() + 30.0
        while self._out and not self.gone and time.monotonic() < deadline:
            await asyncio.sleep(0.001)
        self.loop.remove_writer(self.fd)
        self.sock.close()
        return bytes(self.extra)


class Exchange:
    """One request answered on a handed-over connection: the ASGI `receive` and `send` uvicorn would give the
    app, writing HTTP/1.1 straight to the caller, and the progress byte the router reads after a crash."""

    def __init__(self, scope: dict, body: bytes, caller: Caller, progress: Callable[[int], None]) -> None:
        self.scope, self.body, self.caller, self.progress = scope, body, caller, progress
        self.keep = keeps_alive(scope)
        self._body_given = False
        self._head: dict | None = None
        self._chunked: bool | None = None  # None: the head is not written yet
        self.complete = False

    async def receive(self) -> dict:
        if not self._body_given:
            self._body_given = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.caller.over.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self._head = message
            if not any(k.lower() == b"content-length" for k, _ in message.get("headers", [])):
                self.caller.write(self._write_head(b"", True))  # a stream's head now, as uvicorn sends it
            return
        if self.complete:
            raise RuntimeError("a message after the answer was complete")
        if not self.caller.writable.is_set():
            await self.caller.writable.wait()
        body, more = message.get("body", b""), message.get("more_body", False)
        out = b""
        if self._chunked is None:
            out = self._write_head(body, more)
        if self._chunked:
            out += (chunk(body) if body else b"") + (b"" if more else b"0\r\n\r\n")
        else:
            out += body
        self.caller.write(out)
        if not more:
            self.complete = True
            self.progress(wire.COMPLETE)
            self.caller.over.set()

    def _write_head(self, body: bytes, more: bool) -> bytes:
        head = self._head or {"status": 500, "headers": []}
        status = head["status"]
        headers = [(k.lower(), v) for k, v in head.get("headers", [])]
        names = {k for k, _ in headers}
        self._chunked = b"content-length" not in names and more
        if not self._chunked and b"content-length" not in names:
            headers.append((b"content-length", str(len(body)).encode()))
        if self._chunked:
            headers.append((b"transfer-encoding", b"chunked"))
        if not self.keep and b"connection" not in names:
            headers.append((b"connection", b"close"))
        self.progress(wire.CHUNKED if self._chunked else wire.LENGTH)
        return _status_line(status) + b"date: " + _date() + b"\r\n" + b"".join(
            k + b": " + v + b"\r\n" for k, v in headers) + b"\r\n"

    async def run(self, app: Asgi) -> None:
        """The app on this request; a failure before the head is uvicorn's 500, after it a closed connection."""
        try:
            await app(self.scope, self.receive, self.send)
        except Exception:
            log.exception("Exception in ASGI application (a request the router handed over)")
            self.keep = False
            if self._chunked is None and not self.caller.gone:
                self._head = {"status": 500, "headers": [(b"content-type", b"text/plain; charset=utf-8")]}
                await self.send({"type": "http.response.body", "body": b"Internal Server Error"})
        finally:
            if not self.complete or self.caller.gone:
                self.keep = False


def _status_line(status: int) -> bytes:
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = ""
    return f"HTTP/1.1 {status} {phrase}\r\n".encode()


_date_cache: tuple[int, bytes] = (0, b"")


def _date() -> bytes:
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, email.utils.formatdate(now, usegmt=True).encode())
    return _date_cache[1]
