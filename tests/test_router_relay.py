"""The router's HTTP/1.1 client (router/relay.py) against a raw asyncio server that answers as uvicorn does:
bodies framed by length, by chunks and by the connection's close; a keep-alive connection reused; one the
peer closed while idle retried once; a caller that hangs up mid-stream closes the runner's connection at once.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

import pytest

from localspec.router.proxy import forward
from localspec.router.relay import UpstreamBroken, Upstreams

Answer = Callable[[bytes], list[bytes]]  # the request's head -> what to write, piece by piece


class Peer:
    """A loopback server: counts connections, records each request's head, answers with `answer`, and closes
    the connection after each answer when `close_after` (a runner whose keep-alive timeout passed)."""

    def __init__(self, answer: Answer, close_after: bool = False, pause: float = 0.0) -> None:
        self.answer, self.close_after, self.pause = answer, close_after, pause
        self.connections = 0
        self.heads: list[bytes] = []
        self.hung_up = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(ln.split(b":")[1]) for ln in head.split(b"\r\n")
                              if ln.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                self.heads.append(head)
                for piece in self.answer(head):
                    writer.write(piece)
                    await writer.drain()
                    await asyncio.sleep(self.pause)
                if self.close_after:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.hung_up.set()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: Any) -> None:
        self.server.close()


def sized(body: bytes) -> Answer:
    return lambda head: [b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                         + str(len(body)).encode() + b"\r\n\r\n" + body]


def chunked(*pieces: bytes) -> Answer:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    return lambda _: [head] + [f"{len(p):x}\r\n".encode() + p + b"\r\n" for p in pieces] + [b"0\r\n\r\n"]


async def test_a_sized_answer_is_read_whole_and_its_connection_reused():
    peer = Peer(sized(b'{"ok": true}'))
    async with peer as url:
        ups = Upstreams()
        for _ in range(3):
            reply = await ups.send(url, "POST", "/completion", [(b"x-test", b"1")], b"{}")
            assert reply.status == 200 and reply.header(b"content-type") == b"application/json"
            assert await reply.read() == b'{"ok": true}'
            reply.close()
        assert peer.connections == 1 and len(peer.heads) == 3
        assert b"x-test: 1\r\n" in peer.heads[0] and b"content-length: 2\r\n" in peer.heads[0]
        ups.close()


async def test_chunked_pieces_come_as_they_arrive_those_sent_together_joined():
    peer = Peer(chunked(b"data: a\n\n", b"data: b\n\n"), pause=0.05)
    async with peer as url:
        ups = Upstreams()
        reply = await ups.send(url, "POST", "/infill", [], b"{}")
        assert [p async for p in reply.pieces()] == [b"data: a\n\n", b"data: b\n\n"]  # as the runner framed them
        reply.close()
        peer.answer = lambda head: [b"".join(chunked(b"data: a\n\n", b"data: b\n\n", b"data: c\n\n")(head))]
        reply = await ups.send(url, "POST", "/infill", [], b"{}")
        assert [p async for p in reply.pieces()] == [b"data: a\n\ndata: b\n\ndata: c\n\n"]  # one write: one piece
        reply.close()
        peer.answer = chunked(b"data: a\n\n", b"data: b\n\n")
        reply = await ups.send(url, "POST", "/infill", [], b"{}")  # the same connection, read to its end
        assert await reply.read() == b"data: a\n\ndata: b\n\n"
        reply.close()
        assert peer.connections == 1
        ups.close()


async def test_bytes_that_are_not_chunked_framing_are_a_broken_upstream():
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    for bad in (b"zz\r\ndata\r\n", b"4\r\ndata!!\r\n"):
        async with Peer(lambda _, bad=bad: [head + bad]) as url:
            reply = await Upstreams().send(url, "POST", "/infill", [], b"{}")
            with pytest.raises(UpstreamBroken):
                [p async for p in reply.pieces()]
            reply.close()


async def test_a_connection_the_runner_closed_while_idle_is_retried_once_on_a_new_one():
    peer = Peer(sized(b"{}"), close_after=True)
    async with peer as url:
        ups = Upstreams()
        for _ in range(2):
            reply = await ups.send(url, "POST", "/completion", [], b"{}")
            assert await reply.read() == b"{}"
            reply.close()
            await asyncio.sleep(0.05)  # the peer's close arrives
        assert peer.connections == 2 and len(peer.heads) == 2  # each request read exactly once
        ups.close()


async def test_an_answer_cut_short_and_a_refused_connection_are_upstream_broken():
    cut = Peer(lambda _: [b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"], close_after=True)
    async with cut as url:
        reply = await Upstreams().send(url, "POST", "/x", [], b"")
        with pytest.raises(UpstreamBroken):
            await reply.read()
        reply.close()
    with pytest.raises(UpstreamBroken):
        await Upstreams().send(url, "POST", "/x", [], b"")  # nothing listens there now


class Caller:
    """An ASGI caller: what the app sends it, and a disconnect once `hang_up` is set."""

    def __init__(self) -> None:
        self.sent: list[dict] = []
        self.hang_up = asyncio.Event()

    async def receive(self) -> dict:
        await self.hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)
        if message.get("body"):
            self.hang_up.set()  # the caller leaves after the first piece of the answer


class Up:
    def __init__(self, url: str) -> None:
        self.url = url
        self.alive = True

    def failure(self) -> None:
        return None

    async def died(self, timeout: float = 2.0) -> None:
        return None


async def test_a_caller_that_hangs_up_mid_stream_closes_the_runners_connection_at_once():
    peer = Peer(chunked(*[b"data: x\n\n"] * 50), pause=0.05)  # 2.5 s of stream if nobody stops it
    async with peer as url:
        caller, released = Caller(), []
        scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "query_string": b""}
        await asyncio.wait_for(forward(Upstreams(), scope, caller.receive, caller.send, Up(url), b"{}", "m",
                                       lambda: released.append(1)), 1.0)
        await asyncio.wait_for(peer.hung_up.wait(), 1.0)
    assert caller.sent[0]["type"] == "http.response.start" and caller.sent[1]["body"] == b"data: x\n\n"
    assert released == [1]
