"""The hand-off of a caller's connection to a runner (router/handoff.py, server/handoff.py), in one process and
without models: the real router app under uvicorn with its Front protocol on a real port, and a stand-in runner
that is a small ASGI app served two ways, as a runner is: by its Adopter on the channel the router made (the
hand-off) and by uvicorn on a port of its own (the relay, for what is not handed over). The caller is a raw
socket, so the tests see exactly what crosses the connection and when.

Checks: a streamed and a whole answer come from the runner on the caller's own connection, which then carries
the router's own routes and more answers; a request sent the moment an answer ends is not lost; Connection:
close is honoured; a caller who hangs up mid-stream is seen by the runner's app; a runner that dies before its
answer or mid-stream leaves the caller the protocol's error; a browser's request (Origin) is relayed with its
CORS headers; no descriptor is left open; the wire's request message round-trips.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

import pytest
import uvicorn

from localspec.commands.supervise import crash_line
from localspec.router.app import build_router
from localspec.router.errors import UnknownModel
from localspec.router.handoff import NO_HOLD_ENV, Channel, front_protocol, supported
from localspec.server import bind
from localspec.server import handoff as server_handoff
from localspec.server.channel import HEAD, decode_request, encode_request, hold_key
from localspec.server.handoff import Adopter

pytestmark = pytest.mark.skipif(not supported(), reason="no SCM_RIGHTS hand-off on this platform")
CAUSE = crash_line(signal.SIGSEGV)


class App:
    """The stand-in runner's app. POST bodies say what to do: {"stream": n} n SSE events, {"wait": true} one event
    then wait for the caller to leave, {"die": "early"|"mid"} the runner dies before answering or after one
    event; otherwise a JSON answer naming the model."""

    def __init__(self) -> None:
        self.disconnects = 0
        self.die: Any = None  # set by the test: kills the stand-in runner
        self.gate = asyncio.Event()  # {"gated": true}: the stream's first event waits for it
        self.gate.set()

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = json.loads((await receive())["body"] or b"{}")
        if body.get("die") == "early":
            return await self._die()
        if "stream" in body or "wait" in body or body.get("die") == "mid":
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/event-stream")]})
            await self.gate.wait()
            for i in range(body.get("stream", 1)):
                await send({"type": "http.response.body", "body": b"data: %d\n\n" % i, "more_body": True})
            if body.get("die") == "mid":
                return await self._die()
            if body.get("wait"):
                while (await receive())["type"] != "http.disconnect":
                    pass
                self.disconnects += 1
                return
            return await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        answer = json.dumps({"model": body.get("model"), "path": scope["path"]}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": answer})

    async def _die(self) -> None:
        self.die()
        await asyncio.sleep(3600)


@dataclass
class StandIn:
    """A runner without a process: the channel's runner end is an Adopter in this process; `die()` closes it as
    the kernel would for a dead process (no DONE, nothing flushed)."""

    app: App
    url: str = ""
    name: str = "a"
    dead: bool = False
    channel: Channel = field(default_factory=Channel)

    def __post_init__(self) -> None:
        control, page = (os.dup(fd) for fd in self.channel.child_fds)
        self.adopter = Adopter(self.app, control, page)
        self.app.die = self.die

    def start(self) -> None:
        self.adopter.start()
        self.channel.started(self)

    @property
    def alive(self) -> bool:
        return not self.dead

    def failure(self) -> str | None:
        return CAUSE if self.dead else None

    async def died(self, timeout: float = 2.0) -> str | None:
        return self.failure()

    def die(self) -> None:
        self.dead = True
        self.adopter.close()


@dataclass
class Pool:
    runner: StandIn
    released: int = 0
    retaken: int = 0
    loading: bool = False  # try_acquire says no: the request takes the ASGI path, as one whose model loads

    def known(self) -> list[str]:
        return ["a"]

    def resolve(self, name: str) -> str:
        if name != "a":
            raise UnknownModel(name, ["a"])
        return name

    def loaded(self) -> list[str]:
        return ["a"]

    def state(self, name: str) -> str:
        return "loaded"

    def try_acquire(self, name: str, keep_alive: float | None = None) -> StandIn | None:
        return self.runner if self.runner.alive and not self.loading else None

    async def acquire(self, name: str, keep_alive: float | None = None) -> StandIn:
        await asyncio.sleep(0.05)
        return self.runner

    def release(self, runner: StandIn, keep_alive: float | None = None) -> None:
        self.released += 1

    def retake(self, runner: StandIn) -> bool:
        self.retaken += 1
        return runner is self.runner

    async def run_reaper(self) -> None:
        await asyncio.sleep(3600)

    async def close(self) -> None:
        pass


@asynccontextmanager
async def serving(app: Any, http: Any = "auto") -> AsyncIterator[tuple[int, uvicorn.Server]]:
    server = uvicorn.Server(uvicorn.Config(app, http=http, log_level="warning", lifespan="off"))
    sock = bind("127.0.0.1", 0)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield sock.getsockname()[1], server
    finally:
        server.should_exit = True
        await task


@asynccontextmanager
async def router() -> AsyncIterator[tuple[int, StandIn, Pool]]:
    app = App()
    async with serving(app) as (runner_port, _):
        runner = StandIn(app, url=f"http://127.0.0.1:{runner_port}")
        runner.start()
        pool = Pool(runner)
        built = build_router(pool)
        async with serving(built.app, front_protocol(built.forwarder.try_hand)) as (port, _):
            yield port, runner, pool
        runner.channel.close()
        runner.adopter.close()


class Conn:
    """A raw HTTP/1.1 connection: `ask` writes a request and reads its whole answer (length or chunked)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> "Conn":
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    def send(self, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> None:
        data = json.dumps(body).encode() if body is not None else b""
        lines = [f"{method} {path} HTTP/1.1", "host: test", f"content-length: {len(data)}",
                 *(f"{k}: {v}" for k, v in (headers or {}).items())]
        self.writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + data)

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), 10)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        if "content-length" in headers:
            return status, headers, await self.reader.readexactly(int(headers["content-length"]))
        body = b""
        while size := int((await self.reader.readline()).strip(), 16):
            body += await self.reader.readexactly(size)
            await self.reader.readexactly(2)
        await self.reader.readexactly(2)
        return status, headers, body

    async def ask(self, method: str, path: str, body: dict | None = None,
                  headers: dict | None = None) -> tuple[int, dict[str, str], bytes]:
        self.send(method, path, body, headers)
        return await self.answer()

    def close(self) -> None:
        self.writer.close()


async def until(done: Any, timeout: float = 5.0) -> bool:
    for _ in range(int(timeout / 0.01)):
        if done():
            return True
        await asyncio.sleep(0.01)
    return bool(done())


async def hops(conn: Conn) -> dict[str, int]:
    _, _, body = await conn.ask("GET", "/props")
    return json.loads(body)["hops"]


async def test_answers_come_from_the_runner_on_the_callers_own_connection_which_then_serves_on():
    async with router() as (port, runner, pool):
        conn = await Conn.open(port)
        status, headers, body = await conn.ask("POST", "/completion", {"model": "a", "stream": 3})
        assert status == 200 and headers["transfer-encoding"] == "chunked" and "server" not in headers
        assert body == b"data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"
        status, headers, body = await conn.ask("POST", "/v1/chat/completions", {"model": "a"})
        assert status == 200 and json.loads(body) == {"model": "a", "path": "/v1/chat/completions"}
        assert await hops(conn) == {"handed_early": 2, "handed": 0, "relayed": 0, "held": 0}  # the router's own route
        for i in range(20):  # the router takes the connection back after each answer
            assert json.loads((await conn.ask("POST", "/infill", {"model": "a", "n": i}))[2])["path"] == "/infill"
        assert await until(lambda: pool.released == 22)  # each when its runner is done with the connection
        conn.close()


async def test_a_request_that_waited_for_its_model_is_handed_over_from_the_asgi_path():
    async with router() as (port, _, pool):
        pool.loading = True
        conn = await Conn.open(port)
        for _ in range(2):
            status, _, body = await conn.ask("POST", "/completion", {"model": "a", "stream": 2})
            assert status == 200 and body.endswith(b"data: [DONE]\n\n")
            assert json.loads((await conn.ask("POST", "/infill", {"model": "a"}))[2])["path"] == "/infill"
        assert await hops(conn) == {"handed_early": 0, "handed": 4, "relayed": 0, "held": 0}
        assert await until(lambda: pool.released == 4)
        conn.close()


async def test_a_streams_head_comes_before_its_first_event_as_from_a_single_server():
    """The caller reads the head while the runner evaluates the prompt, not with the first token."""
    async with router() as (port, runner, _):
        runner.app.gate.clear()
        conn = await Conn.open(port)
        conn.send("POST", "/completion", {"model": "a", "stream": 1})
        head = await asyncio.wait_for(conn.reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in head
        runner.app.gate.set()
        assert await asyncio.wait_for(conn.reader.readuntil(b"data: 0\n\n"), 5)
        conn.close()


@pytest.mark.parametrize("held", [True, False])
async def test_a_request_sent_the_moment_an_answer_ends_is_not_lost(held, monkeypatch):
    """The caller's next request may reach the runner while it still has the connection: held, the runner answers
    it; not held (LOCALSPEC_NO_HOLD=1), it goes back to the router with the connection, and is answered."""
    if not held:
        monkeypatch.setenv(NO_HOLD_ENV, "1")
    async with router() as (port, _, pool):
        conn = await Conn.open(port)
        for i in range(50):
            conn.send("POST", "/completion", {"model": "a", "stream": 1})
            assert (await conn.answer())[2] == b"data: 0\n\ndata: [DONE]\n\n"
        counts = await hops(conn)
        assert (counts["handed_early"], counts["held"]) == ((1, 49) if held else (50, 0))
        assert await until(lambda: pool.released == 50) and pool.retaken == counts["held"]
        conn.close()


async def test_a_held_connection_carries_the_callers_next_requests_for_its_model_past_the_router():
    """One hand-off, then the runner reads and answers the caller's next requests for the same model and path
    itself, whole or streamed, one arriving in two pieces; each takes and releases the model in the pool."""
    async with router() as (port, runner, pool):
        conn = await Conn.open(port)
        for body in ({"model": "a"}, {"model": "a", "stream": 2}, {"model": "a", "n": 1}):
            status, _, answer = await conn.ask("POST", "/completion", body)
            assert status == 200 and (b"data: 1" in answer if "stream" in body else json.loads(answer)["model"] == "a")
        data = json.dumps({"model": "a"}).encode()
        conn.writer.write(b"POST /completion HTTP/1.1\r\nhost: test\r\ncontent-length: %d\r\n\r\n" % len(data))
        await asyncio.sleep(0.05)
        conn.writer.write(data)
        status, _, answer = await conn.answer()
        assert status == 200 and json.loads(answer) == {"model": "a", "path": "/completion"}
        assert await hops(conn) == {"handed_early": 1, "handed": 0, "relayed": 0, "held": 3}
        assert await until(lambda: pool.released == 4) and pool.retaken == 3
        conn.close()


async def test_what_is_not_the_held_models_goes_back_to_the_router_with_the_connection():
    """Another model (here unknown: the router's 404 in the protocol's shape), a request without a model, the
    router's own routes, Ollama's keep_alive: the router reads each, on the same connection, then hands over
    again."""
    async with router() as (port, runner, pool):
        conn = await Conn.open(port)
        assert (await conn.ask("POST", "/v1/chat/completions", {"model": "a"}))[0] == 200
        status, _, body = await conn.ask("POST", "/v1/chat/completions", {"model": "b"})
        assert status == 404 and "b" in json.loads(body)["error"]["message"]
        assert (await conn.ask("POST", "/v1/chat/completions", {"model": "a"}))[0] == 200
        assert (await conn.ask("POST", "/v1/chat/completions", {}))[0] == 200
        assert (await conn.ask("POST", "/api/generate", {"model": "a", "prompt": "x"}))[0] == 200
        assert (await conn.ask("POST", "/api/generate", {"model": "a", "prompt": "x", "keep_alive": 5}))[0] == 200
        counts = await hops(conn)
        assert counts == {"handed_early": 5, "handed": 0, "relayed": 0, "held": 0}
        conn.close()


async def test_a_recalled_connection_goes_back_to_the_router_and_loses_nothing():
    """Before the router stops a runner it recalls the connections held idle: the caller's next request reaches
    the router, which hands it over again."""
    async with router() as (port, runner, pool):
        conn = await Conn.open(port)
        assert (await conn.ask("POST", "/completion", {"model": "a"}))[0] == 200
        await asyncio.sleep(0.05)  # the runner holds it, idle
        await asyncio.wait_for(runner.channel.recall(), 5)
        assert not runner.channel.pending
        assert (await conn.ask("POST", "/completion", {"model": "a"}))[0] == 200
        assert await hops(conn) == {"handed_early": 2, "handed": 0, "relayed": 0, "held": 0}
        conn.close()


async def test_a_runner_that_dies_holding_an_idle_connection_leaves_it_to_the_router():
    async with router() as (port, runner, pool):
        conn = await Conn.open(port)
        assert (await conn.ask("POST", "/completion", {"model": "a"}))[0] == 200
        await asyncio.sleep(0.05)
        runner.die()
        assert await until(lambda: not runner.channel.pending)
        assert (await conn.ask("GET", "/health"))[0] == 200  # the router reads the connection again
        conn.close()


async def test_a_caller_that_hangs_up_during_a_held_request_is_seen_by_the_runners_app():
    async with router() as (port, runner, pool):
        conn = await Conn.open(port)
        assert (await conn.ask("POST", "/completion", {"model": "a"}))[0] == 200
        conn.send("POST", "/completion", {"model": "a", "wait": True})
        await conn.reader.readuntil(b"data: 0")
        conn.close()
        assert await until(lambda: runner.app.disconnects == 1)
        assert await until(lambda: not runner.channel.pending and pool.released == 2)


async def test_a_held_connection_idle_too_long_is_closed(monkeypatch):
    monkeypatch.setattr(server_handoff, "HOLD_S", 0.2)
    async with router() as (port, runner, pool):
        conn = await Conn.open(port)
        assert (await conn.ask("POST", "/completion", {"model": "a"}))[0] == 200
        assert await asyncio.wait_for(conn.reader.read(), 5) == b""
        assert await until(lambda: not runner.channel.pending and pool.released == 1)


async def test_connection_close_is_honoured():
    async with router() as (port, _, _):
        conn = await Conn.open(port)
        status, headers, _ = await conn.ask("POST", "/completion", {"model": "a"}, {"connection": "close"})
        assert status == 200 and headers["connection"] == "close"
        assert await asyncio.wait_for(conn.reader.read(), 5) == b""


async def test_a_caller_that_hangs_up_mid_stream_is_seen_by_the_runners_app():
    async with router() as (port, runner, pool):
        conn = await Conn.open(port)
        conn.send("POST", "/completion", {"model": "a", "wait": True})
        assert await conn.reader.readuntil(b"data: 0\n\n")
        conn.close()
        assert await until(lambda: runner.app.disconnects == 1 and pool.released == 1)


@pytest.mark.parametrize("path,status,shape", [("/v1/chat/completions", 502, "openai"), ("/api/chat", 500, "ollama"),
                                               ("/v1/messages", 502, "anthropic")])
async def test_a_runner_that_dies_before_answering_leaves_the_protocols_error(path, status, shape):
    async with router() as (port, _, _):
        conn = await Conn.open(port)
        got, headers, body = await conn.ask("POST", path, {"model": "a", "die": "early"})
        error = json.loads(body)
        assert got == status and headers["connection"] == "close"
        message = {"openai": lambda: error["error"]["message"], "ollama": lambda: error["error"],
                   "anthropic": lambda: error["error"]["message"]}[shape]()
        assert "SIGSEGV" in message
        if shape == "ollama":
            assert message.startswith("llama runner process has terminated: ")


async def test_a_runner_that_dies_mid_stream_ends_it_with_an_error_event():
    async with router() as (port, _, _):
        conn = await Conn.open(port)
        status, _, body = await conn.ask("POST", "/v1/chat/completions", {"model": "a", "die": "mid"})
        events = body.decode().split("\n\n")
        assert status == 200 and events[0] == "data: 0"
        error = json.loads(events[1].removeprefix("data: "))
        assert "SIGSEGV" in error["error"]["message"] and "'a'" in error["error"]["message"]


async def test_a_browsers_request_is_relayed_with_its_cors_headers():
    async with router() as (port, _, _):
        conn = await Conn.open(port)
        status, headers, body = await conn.ask("POST", "/completion", {"model": "a"},
                                               {"origin": "http://localhost:3000"})
        assert status == 200 and headers["access-control-allow-origin"] == "http://localhost:3000"
        assert await hops(conn) == {"handed_early": 0, "handed": 0, "relayed": 1, "held": 0}
        conn.close()


async def test_no_descriptor_is_left_open():
    def open_fds() -> int:
        return len(os.listdir("/proc/self/fd"))

    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc")
    async with router() as (port, _, _):
        conn = await Conn.open(port)
        await conn.ask("POST", "/completion", {"model": "a"})
        before = open_fds()
        for _ in range(30):
            await conn.ask("POST", "/completion", {"model": "a", "stream": 2})
            other = await Conn.open(port)
            await other.ask("POST", "/completion", {"model": "a"}, {"connection": "close"})
            other.close()
        await asyncio.sleep(0.2)
        assert open_fds() <= before + 1
        conn.close()


def test_the_request_message_round_trips():
    scope = {"method": "POST", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"autoload=true", "headers": [(b"content-type", b"application/json")],
             "client": ("127.0.0.1", 5555), "server": ("127.0.0.1", 8012), "http_version": "1.1"}
    hold = hold_key(scope["path"], scope["headers"], {"model": "a"})
    message = encode_request(7, scope, b"{}", hold)
    got, held = decode_request(message[HEAD.size:-2])
    assert {k: got[k] for k in scope} == scope and message.endswith(b"{}") and held == hold


def test_a_socket_pair_carries_the_descriptor_with_its_message():
    a, b = socket.socketpair()
    r, w = os.pipe()
    try:
        socket.send_fds(a, [b"x"], [r])
        _, fds, _, _ = socket.recv_fds(b, 16, 2)
        assert len(fds) == 1
        os.close(fds[0])
    finally:
        for fd in (r, w):
            os.close(fd)
        a.close()
        b.close()
