"""A runner's side of the router's hand-off: the caller's own connection, passed by the router with one request
already read from it, answered here directly, then given back to the router for the caller's next request.

Why: a relayed answer crosses one more process, and each streamed event the router relays is CPU taken from the
runner's llama.cpp threads on a small machine (docs/bench/router.md#handoff). With the connection handed over
(SCM_RIGHTS on a Unix socket pair the router made for this runner), the runner writes its answer to the caller
itself and the router relays nothing.

The wire and the progress page are channel.py's. What the runner writes of an answer goes to the page before
each step, so the router, reading it only after a crash, ends the answer in the right framing (proxy.py's
messages); nothing here wakes the router before the answer is done.

Held connections: when the router sends a request with a hold key, the runner keeps the connection after the
answer and reads the caller's next request itself (held.py); one for this runner's model is answered here (the
router told BUSY, for its books), anything else goes back to the router with the bytes read. An idle held
connection goes back when the router recalls it (before it stops this runner), and is closed after HOLD_S
without a request, as uvicorn closes an idle keep-alive connection.
"""

from __future__ import annotations

import asyncio
import collections
import mmap
import os
import socket

from . import channel as wire
from .channel import Hold, Outbox, decode_request, slot
from .exchange import Asgi, Caller, Exchange
from .held import MORE, parse

SETTLE_S = 0.002  # after an answer, the connection goes back this much later, unless the caller writes first
HOLD_S = 5.0  # a held connection idle this long is closed (uvicorn's keep-alive timeout)


class Adopter:
    """Reads the router's hand-offs on `control` and answers each with `app` (this runner's whole ASGI app, its
    middleware included) on the caller's own connection, holding it for the caller's next requests when the
    router says they may be answered here."""

    def __init__(self, app: Asgi, control_fd: int, progress_fd: int) -> None:
        self.app = app
        self.sock = socket.socket(fileno=control_fd)
        self.sock.setblocking(False)
        self.page = mmap.mmap(progress_fd, wire.SLOTS)
        os.close(progress_fd)
        self.recalled = False  # the router recalled the held connections: hold none until its next hand-off
        self._buf = bytearray()
        self._fds: collections.deque[int] = collections.deque()
        self._tasks: set[asyncio.Task] = set()
        self._waiting: dict[int, Caller] = {}  # held connections waiting for the caller's bytes, by request id
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
        while len(self._buf) >= wire.HEAD.size:
            magic, request_id, n_meta, n_body = wire.HEAD.unpack_from(self._buf)
            if magic != wire.MAGIC:
                raise RuntimeError("the router's hand-off channel is out of step")
            end = wire.HEAD.size + n_meta + n_body
            if len(self._buf) < end:
                return
            start = wire.HEAD.size
            meta, body = bytes(self._buf[start:start + n_meta]), bytes(self._buf[start + n_meta:end])
            del self._buf[:end]
            if request_id == wire.RECALL:
                self._recall()
            else:
                self._start(request_id, *decode_request(meta), body, self._fds.popleft())

    def _start(self, request_id: int, scope: dict, hold: Hold | None, body: bytes, fd: int) -> None:
        """The app on the request at once, on the caller's socket."""
        assert self._loop is not None
        self.recalled = False
        index = slot(request_id)
        caller = Caller(socket.socket(fileno=fd), self._loop)
        exchange = Exchange(scope, body, caller, lambda state: self.page.__setitem__(index, state))
        task = self._loop.create_task(self._answer(request_id, exchange, hold))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _note(self, request_id: int, what: int, extra: bytes = b"") -> None:
        assert self._outbox is not None
        try:
            self._outbox.put(wire.NOTE.pack(request_id, what, len(extra)) + extra)
        except OSError:
            pass  # the router is gone

    def _recall(self) -> None:
        """The router will stop this runner: every held connection waiting for the caller goes back now (with
        what the caller sent of a request), before RECALLED; those being answered go back when answered."""
        self.recalled = True
        waiting, self._waiting = self._waiting, {}
        for request_id, caller in waiting.items():
            self._note(request_id, wire.CLOSE if caller.gone else wire.KEEP, caller.give_back())
        self._note(wire.RECALL, wire.RECALLED)

    async def _answer(self, request_id: int, exchange: Exchange, hold: Hold | None) -> None:
        """Answer; then, while the caller's next requests are this runner's (`hold`), answer those too on the
        held connection; then give it back: KEEP (or CLOSE), with what the caller sent that was not answered."""
        caller, keep = exchange.caller, False
        try:
            while True:
                await exchange.run(self.app)
                keep = exchange.keep and not caller.gone
                if not caller.gone:  # closed or kept, the router hears of it once the caller has read the answer
                    await caller.settle(SETTLE_S)
                if not keep or hold is None or self.recalled:
                    break
                request = await self._next(request_id, caller, hold, exchange.scope)
                if caller.given_back:
                    return
                if request is None:
                    keep = not caller.gone and caller.heard.is_set()  # not heard: HOLD_S idle, closed
                    break
                self._note(request_id, wire.BUSY)
                caller.again()
                exchange = Exchange(*request, caller, exchange.progress)
        finally:
            if not caller.given_back:
                extra = await caller.release()
                self._note(request_id, wire.KEEP if keep and not caller.gone else wire.CLOSE, extra)

    async def _next(self, request_id: int, caller: Caller, hold: Hold, like: dict) -> tuple[dict, bytes] | None:
        """The caller's next request, when it is this runner's (held.parse); None to give the connection back:
        not this runner's, the caller left, the router recalled it, or nothing came for HOLD_S."""
        index = slot(request_id)
        if not caller.extra:
            self.page[index] = wire.HELD
            caller.noticed = lambda: self.page.__setitem__(index, wire.NOTHING)  # a crash now: an error answer
            self._note(request_id, wire.IDLE)
        while True:
            if caller.extra:
                caller.noticed = None
                self.page[index] = wire.NOTHING
                got = parse(bytes(caller.extra), hold, like)
                if got != MORE:
                    return got if isinstance(got, tuple) else None
            self._waiting[request_id] = caller
            try:
                heard = await caller.hear(HOLD_S)
            finally:
                self._waiting.pop(request_id, None)
            if not heard or caller.gone or caller.given_back:
                return None
