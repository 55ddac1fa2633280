"""The router's side of the hand-off (server/handoff.py has the runner's side, server/channel.py the wire): the
caller's connection itself goes to the runner, which answers on it, and comes back when the answer is done.

Why: relaying a streamed answer costs the router a wake-up and some 100 us of CPU per event, and on a 2-core
machine that CPU is taken from the runner's llama.cpp threads (docs/bench/router.md#handoff). Handed over, the
answer goes from the runner to the caller directly; the router reads the request, picks the model, and is woken
again only when the answer is done.

How: uvicorn runs the router with `Front`, its httptools protocol that also puts itself in each request's scope
(scope["extensions"][CONNECTION]). `Channel.hand` sends the connection's socket with the request to the runner
(SCM_RIGHTS copies the descriptor into it), stops reading the connection, and marks the request answered in
uvicorn's protocol. When the runner says it is done, the protocol reads the connection again, as after an
answer of its own, fed first what the caller sent meanwhile.

Held connections: a request with a hold key (channel.hold_key: it names its model, and nothing in it is the
router's to apply) lets the runner keep the connection after its answer and answer the caller's next requests
like it itself (server/handoff.py). The runner says IDLE when an answer is done (the model is released here),
BUSY when it takes the next one (the model is taken again, `again`), and gives the connection back with
anything else the caller sends. Before a runner is stopped, `recall` has it give back the connections it holds
idle, so none is lost with it.

A runner that dies mid-answer: its end of the channel closes, and for each request it held, the page it shared
says how far the answer got: nothing written (the protocol's whole error answer, proxy.crash_answer), a chunked
stream under way (a last error event, proxy.error_event, and the last chunk), or a whole answer written (the
connection is closed). The cause is the runner's (proxy.cause_of_death), as for a relayed answer.

Not handed over (relay.py carries them): a request with an Origin (the router's CORS middleware adds headers to
the answer), one behind another pipelined on the same connection, and every request where the platform has no
SCM_RIGHTS or LOCALSPEC_NO_HANDOFF=1 is set (which also lets the two be measured against each other).
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import socket
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

from ..server import channel as wire
from ..server.channel import Hold, Outbox, chunk, encode_request, received, slot
from .proxy import Upstream, cause_of_death, crash_answer, crash_message, error_event

log = logging.getLogger("localspec.router")
CONNECTION = "localspec.connection"  # the scope extension that carries the caller's connection
NO_HANDOFF_ENV = "LOCALSPEC_NO_HANDOFF"
NO_HOLD_ENV = "LOCALSPEC_NO_HOLD"  # runners give every connection back after each answer (to measure the two)

try:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
except ImportError:  # no httptools: uvicorn's h11 protocol, and every answer relayed
    HttpToolsProtocol = None  # type: ignore[assignment, misc]


def supported() -> bool:
    return (HttpToolsProtocol is not None and hasattr(socket, "send_fds") and hasattr(socket, "AF_UNIX")
            and os.environ.get(NO_HANDOFF_ENV, "") in ("", "0"))


if HttpToolsProtocol is not None:
    class Front(HttpToolsProtocol):
        """uvicorn's httptools protocol, with itself in each request's scope (so the ASGI path can hand the
        connection over), and a shortcut: a POST is held until its body is complete, then offered to
        `try_hand` right in this read callback, before uvicorn makes a task for it. Taken, the request never
        reaches the ASGI app (no task, no middleware, no loop iteration before the runner has it); declined,
        uvicorn's task starts as it would have (uvicorn calls `_start_asgi_task` for each request; one
        without it hands over from the ASGI path only)."""

        try_hand: Callable[[dict, bytes], bool] | None = None
        _held: tuple[Any, Any] | None = None

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self.scope["extensions"] = {CONNECTION: {"protocol": self}}

        def _start_asgi_task(self, cycle: Any, app: Any) -> None:
            if (self.try_hand is not None and self._held is None and cycle.scope["method"] == "POST"
                    and cycle.more_body and not self.expect_100_continue and not self.pipeline):
                self._held = (cycle, app)  # until its body is complete (data_received)
                return
            super()._start_asgi_task(cycle, app)

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            held = self._held
            if held is None or held[0].more_body:
                return
            self._held = None
            cycle, app = held
            try_hand = self.try_hand
            if try_hand is not None and self.cycle is cycle and not self.pipeline and not self.transport.is_closing():
                try:
                    if try_hand(dict(cycle.scope), bytes(cycle.body)):
                        return
                except Exception:  # the ASGI path answers it, and reports what went wrong
                    log.exception("hand-off failed; the request goes the ASGI way")
            super()._start_asgi_task(cycle, app)

        def connection_lost(self, exc: Exception | None) -> None:
            self._held = None
            super().connection_lost(exc)


def holds() -> bool:
    """Whether runners may hold a connection for the caller's next requests (off: LOCALSPEC_NO_HOLD=1)."""
    return os.environ.get(NO_HOLD_ENV, "") in ("", "0")


def front_protocol(try_hand: Callable[[dict, bytes], bool] | None = None) -> Any:
    """uvicorn's `http` setting for the router: Front (with `try_hand`, the Forwarder's, as its shortcut)
    where hand-offs work, else uvicorn's own choice."""
    if not supported():
        return "auto"
    return type("Front", (Front,), {"try_hand": staticmethod(try_hand)}) if try_hand else Front


@dataclass(eq=False)
class _Pending:
    protocol: Any  # the router's Front protocol of the caller's connection, lent to the runner meanwhile
    path: str
    model: str
    done: Callable[[], None]  # the model's request is over (idempotent)
    again: Callable[[], Callable[[], None]] | None = None  # a held connection's next request: the model taken again


def _progress_page() -> int:
    """A descriptor of SLOTS shared bytes the runner maps too."""
    fd = os.memfd_create("localspec-handoff") if hasattr(os, "memfd_create") else os.dup(
        tempfile.TemporaryFile().fileno())
    os.ftruncate(fd, wire.SLOTS)
    return fd


class Channel:
    """One runner's hand-offs: `child_fds` go to the runner's command line (`--handoff CONTROL,PAGE`), `start`
    once it runs, then `hand` for each request; `close` when it is stopped."""

    def __init__(self) -> None:
        self._ours, self._theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self._ours.setblocking(False)
        self._page_fd = _progress_page()
        self.page = mmap.mmap(self._page_fd, wire.SLOTS)
        self.pending: dict[int, _Pending] = {}
        self.open = False
        self._next = 0
        self._buf = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._outbox: Outbox | None = None
        self._runner: Upstream | None = None
        self._tasks: set[asyncio.Task] = set()
        self._recalled: asyncio.Future | None = None

    @property
    def child_fds(self) -> tuple[int, int]:
        return self._theirs.fileno(), self._page_fd

    def started(self, runner: Upstream) -> None:
        """The runner process holds its ends now: close them here, and read its answers."""
        self._theirs.close()
        os.close(self._page_fd)
        self._runner = runner
        self._loop = asyncio.get_running_loop()
        self._outbox = Outbox(self._ours, self._loop)
        self._loop.add_reader(self._ours.fileno(), self._readable)
        self.open = True

    def hand(self, scope: dict, body: bytes, model: str, done: Callable[[], None], hold: Hold | None = None,
             again: Callable[[], Callable[[], None]] | None = None) -> bool:
        """Lend the caller's connection and its request to the runner; False (nothing done) when this request
        cannot be handed over, and relay.py answers it. `done` runs when the runner has finished with it; with a
        `hold` key the runner may keep the connection for the caller's next requests, each taking the model
        with `again` (which returns that request's `done`).
        Meanwhile the router does not read the connection (the runner does) and its uvicorn protocol holds the
        request as answered, so the ASGI path, if it is the one handing over, may return without an answer."""
        conn = (scope.get("extensions") or {}).get(CONNECTION)
        if not self.open or conn is None or _has_origin(scope):
            return False
        protocol = conn["protocol"]
        transport, cycle = protocol.transport, protocol.cycle
        if protocol.pipeline or transport is None or transport.is_closing() or transport.get_write_buffer_size():
            return False  # a request behind it, or the router's last answer not yet sent: relayed
        self._next = self._next % 0xFFFFFFFF + 1
        request_id = self._next
        self.page[slot(request_id)] = wire.NOTHING
        assert self._outbox is not None
        try:  # the descriptor is copied into the runner as the message is sent
            self._outbox.put(encode_request(request_id, scope, body, hold if again is not None else None),
                             [transport.get_extra_info("socket").fileno()])
        except OSError:  # the runner is gone: relay.py finds out and says why
            return False
        transport.pause_reading()
        cycle.response_started = cycle.response_complete = True
        self.pending[request_id] = _Pending(protocol, scope["path"], model, done, again)
        return True

    async def recall(self, timeout: float = 2.0) -> None:
        """Have the runner give back every connection it holds idle (before it is stopped: a request the
        caller sends then reaches the router, not a runner on its way out). Those it is answering come back
        when answered. Returns once the runner said RECALLED, or after `timeout`."""
        if not self.open or self._outbox is None:
            return
        loop = asyncio.get_running_loop()
        if self._recalled is None or self._recalled.done():
            self._recalled = loop.create_future()
            try:
                self._outbox.put(wire.HEAD.pack(wire.MAGIC, wire.RECALL, 0, 0))
            except OSError:
                return
        try:
            await asyncio.wait_for(asyncio.shield(self._recalled), timeout)
        except asyncio.TimeoutError:
            log.warning("a runner did not give back its held connections in %.0f s", timeout)

    def _readable(self) -> None:
        data = received(self._ours)
        if data is None:
            return
        if not data:
            return self._runner_gone()
        self._buf += data
        while len(self._buf) >= wire.NOTE.size:
            request_id, what, n_extra = wire.NOTE.unpack_from(self._buf)
            end = wire.NOTE.size + n_extra
            if len(self._buf) < end:
                return
            extra = bytes(self._buf[wire.NOTE.size:end])
            del self._buf[:end]
            self._noted(request_id, what, extra)

    def _noted(self, request_id: int, what: int, extra: bytes) -> None:
        if what == wire.RECALLED:
            if self._recalled is not None and not self._recalled.done():
                self._recalled.set_result(None)
            return
        pending = self.pending.get(request_id)
        if pending is None:
            return
        if what == wire.IDLE:  # answered; the runner holds the connection for the caller's next request
            pending.done()
        elif what == wire.BUSY:  # the caller's next request, answered by the runner
            pending.done()
            pending.done = pending.again() if pending.again is not None else _nothing
        else:  # given back: CLOSE or KEEP
            del self.pending[request_id]
            pending.done()
            _take_back(pending.protocol, what == wire.KEEP, extra)

    def _runner_gone(self) -> None:
        """The runner's end closed: it died or was stopped. Each request it held gets its last words."""
        if not self.open:
            return
        self.open = False
        assert self._loop is not None
        self._loop.remove_reader(self._ours.fileno())
        pending, self.pending = self.pending, {}
        if self._recalled is not None and not self._recalled.done():
            self._recalled.set_result(None)
        for request_id, p in pending.items():
            p.done()
            progress = self.page[slot(request_id)]
            if progress == wire.HELD:  # held idle: nothing of the caller's was read, the router reads it again
                _take_back(p.protocol, True, b"")
            else:
                self._spawn(self._last_words(p, progress))

    async def _last_words(self, p: _Pending, progress: int) -> None:
        """What the caller of a dead runner reads last, by how far its answer got; then the connection closes."""
        transport = p.protocol.transport
        if progress in (wire.NOTHING, wire.CHUNKED) and self._runner is not None:
            message = crash_message(p.path, p.model, await cause_of_death(self._runner))
            if not transport.is_closing():
                transport.write(crash_answer(p.path, message) if progress == wire.NOTHING else chunk(
                    error_event(p.path, 500, message)) + b"0\r\n\r\n")
        transport.close()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        """The runner is stopped (or never started): fail what it held, and close the channel."""
        if self._loop is not None:
            self._runner_gone()
        else:
            self._theirs.close()
            _close_quietly(self._page_fd)
        self._ours.close()


def _take_back(protocol: Any, keep: bool, extra: bytes) -> None:
    """The connection after a handed-over answer: uvicorn's protocol reads it again, as after any answer of its
    own (its keep-alive timeout armed), and is fed first what the caller sent meanwhile (its next request, if it
    did not wait). Closed instead when the caller left or asked to close."""
    transport = protocol.transport
    if transport.is_closing():
        return
    if not keep:
        transport.close()
        return
    transport.resume_reading()
    protocol.on_response_complete()
    if extra:
        protocol.data_received(extra)


def _nothing() -> None:
    pass


def _has_origin(scope: dict) -> bool:
    """A browser's request: the router's CORS middleware adds headers to its answer, so it is relayed."""
    return any(k == b"origin" for k, _ in scope["headers"])


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass
