"""A runner's side of the router's hand-off: the caller's own connection, passed by the router with one request
already read from it, answered here directly, then given back to the router for the caller's next request.

Why: a relayed answer crosses one more process, and each streamed event the router relays is CPU taken from the
runner's llama.cpp threads on a small machine (docs/bench/router.md#handoff). With the connection handed over
(SCM_RIGHTS on a Unix socket pair the router made for this runner), the runner writes its answer to the caller
itself and the router relays nothing.

The wire and the progress page are channel.py's. What the runner writes of an answer goes to the page before
each step, so the router, reading it only after a crash, ends the answer in the right framing (proxy.py's
messages); nothing here wakes the router before the answer is done.
"""

from __future__ import annotations

import asyncio
import collections
import email.utils
import logging
import mmap
import os
import socket
import time
from http import HTTPStatus
from typing import Any, Awaitable, Callable

from .channel import CHUNKED, COMPLETE, DONE, HEAD, LENGTH, MAGIC, SLOTS, Outbox, chunk, decode_scope, received, slot

SETTLE_S = 0.002  # after an answer, the connection goes back this much later, unless the caller writes first
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

    async def settle(self, seconds: float) -> None:
        """Wait up to `seconds` for the caller's next bytes: the router, woken the moment the answer ends, would
        take a core from the caller reading that answer's last bytes (and from the model's threads still
        spinning); a caller that writes at once is not kept waiting."""
        if not self.heard.is_set():
            try:
                await asyncio.wait_for(self.heard.wait(), seconds)
            except asyncio.TimeoutError:
                pass

    async def release(self) -> bytes:
        """Stop reading, let what was written leave this process, and close this process's hold on the socket
        (the router's own stays open: no FIN): the caller's further bytes, for the router."""
        self._stop_reading()
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
            self.progress(COMPLETE)
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
        self.progress(CHUNKED if self._chunked else LENGTH)
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


class Adopter:
    """Reads the router's hand-offs on `control` and answers each with `app` (this runner's whole ASGI app, its
    middleware included) on the caller's own connection."""

    def __init__(self, app: Asgi, control_fd: int, progress_fd: int) -> None:
        self.app = app
        self.sock = socket.socket(fileno=control_fd)
        self.sock.setblocking(False)
        self.page = mmap.mmap(progress_fd, SLOTS)
        os.close(progress_fd)
        self._buf = bytearray()
        self._fds: collections.deque[int] = collections.deque()
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: Outbox | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._outbox = Outbox(self.sock, self._loop)
        self._loop.add_reader(self.sock.fileno(), self._readable)

    def close(self) -> None:
        if self.sock.fileno() < 0:
            return
        if self._loop is not None:
            self._loop.remove_reader(self.sock.fileno())
        for task in self._tasks:
            task.cancel()
        while self._fds:
            os.close(self._fds.popleft())
        self.sock.close()

    def _readable(self) -> None:
        try:
            data, fds, _, _ = socket.recv_fds(self.sock, 1 << 16, 4)
        except (BlockingIOError, InterruptedError):
            return
        if not data:  # the router is gone; this process follows it (PR_SET_PDEATHSIG)
            assert self._loop is not None
            self._loop.remove_reader(self.sock.fileno())
            return
        self._buf += data
        self._fds.extend(fds)
        while len(self._buf) >= HEAD.size:
            magic, request_id, n_meta, n_body = HEAD.unpack_from(self._buf)
            if magic != MAGIC:
                raise RuntimeError("the router's hand-off channel is out of step")
            end = HEAD.size + n_meta + n_body
            if len(self._buf) < end:
                return
            meta, body = bytes(self._buf[HEAD.size:HEAD.size + n_meta]), bytes(self._buf[HEAD.size + n_meta:end])
            del self._buf[:end]
            self._start(request_id, decode_scope(meta), body, self._fds.popleft())

    def _start(self, request_id: int, scope: dict, body: bytes, fd: int) -> None:
        """The app on the request at once, on the caller's socket."""
        assert self._loop is not None
        index = slot(request_id)
        caller = Caller(socket.socket(fileno=fd), self._loop)
        exchange = Exchange(scope, body, caller, lambda state: self.page.__setitem__(index, state))
        task = self._loop.create_task(self._answer(request_id, exchange))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, request_id: int, exchange: Exchange) -> None:
        """Answer, then give the connection back: DONE, with what the caller sent meanwhile."""
        assert self._outbox is not None
        try:
            await exchange.run(self.app)
            if exchange.keep:
                await exchange.caller.settle(SETTLE_S)
        finally:
            caller = exchange.caller
            extra = await caller.release()
            try:
                self._outbox.put(DONE.pack(request_id, exchange.keep and not caller.gone, len(extra)) + extra)
            except OSError:
                pass  # the router is gone


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
