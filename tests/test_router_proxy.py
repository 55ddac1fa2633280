"""The router's forward (router/proxy.py) through its pooled client against a raw asyncio server that answers as
uvicorn does: a whole answer passed on with its length over a kept-alive connection, a stream passed on piece by
piece, an answer cut short and a refused connection as the protocol's error, and a caller that hangs up, before
the answer or during it, closing the runner's connection at once.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from localspec.router.proxy import Client, forward

Answer = Callable[[bytes], list[bytes]]  # the request's head -> what to write, piece by piece
CAUSE = "runner killed by SIGSEGV"


class Peer:
    """A loopback server: counts connections, records each request's head, and answers with `answer`; with
    `wait` set it waits for that event between pieces (and sees the other end hang up meanwhile)."""

    def __init__(self, answer: Answer, wait: asyncio.Event | None = None, close_after: bool = False) -> None:
        self.answer, self.wait, self.close_after = answer, wait, close_after
        self.connections = 0
        self.heads: list[bytes] = []
        self.asked = asyncio.Event()  # a request was read
        self.hung_up = asyncio.Event()

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(ln.split(b":")[1]) for ln in head.split(b"\r\n")
                               if ln.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                self.heads.append(head)
                self.asked.set()
                for piece in self.answer(head):
                    writer.write(piece)
                    await writer.drain()
                    if self.wait is not None and not await self._go_on(reader):
                        self.hung_up.set()
                        return
                if self.close_after:
                    writer.transport.abort()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            self.hung_up.set()

    async def _go_on(self, reader: asyncio.StreamReader) -> bool:
        """Wait for `wait`; False when the other end closes the connection first."""
        assert self.wait is not None
        go, eof = asyncio.ensure_future(self.wait.wait()), asyncio.ensure_future(reader.read(1))
        await asyncio.wait({go, eof}, return_when=asyncio.FIRST_COMPLETED)
        go.cancel()
        eof.cancel()
        return go.done() and not go.cancelled()

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


class Caller:
    """An ASGI caller: what the app sends it, and a disconnect once `hang_up` is set (by the test, or after the
    first piece of the answer with `leaves`)."""

    def __init__(self, leaves: bool = False) -> None:
        self.sent: list[dict] = []
        self.hang_up = asyncio.Event()
        self.leaves = leaves
        self.answered = asyncio.Event()  # a piece of the answer's body arrived

    async def receive(self) -> dict:
        await self.hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: dict) -> None:
        self.sent.append(message)
        if message.get("body"):
            self.answered.set()
            if self.leaves:
                self.hang_up.set()

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


class Up:
    """A runner as the proxy sees it: where it listens, and the cause of its death."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.alive = False

    def failure(self) -> str:
        return CAUSE

    async def died(self, timeout: float = 2.0) -> str:
        return CAUSE


def _scope(path: str = "/completion", headers: list | None = None) -> dict:
    return {"type": "http", "method": "POST", "path": path, "query_string": b"", "headers": headers or []}


async def _forward(client: Client, url: str, caller: Caller, scope: dict | None = None) -> list[int]:
    released: list[int] = []
    await asyncio.wait_for(forward(client, scope or _scope(), caller.receive, caller.send, Up(url), b"{}", "m",
                                   lambda: released.append(1)), 5.0)
    return released


async def test_a_whole_answer_is_passed_on_with_its_length_over_one_kept_alive_connection():
    peer = Peer(sized(b'{"ok": true}'))
    client = Client()
    async with peer as url:
        for _ in range(3):
            caller = Caller()
            headers = [(b"x-test", b"1"), (b"authorization", b"Bearer k"), (b"host", b"router")]
            assert await _forward(client, url, caller, _scope(headers=headers)) == [1]
            start = caller.sent[0]
            assert start["status"] == 200 and (b"content-length", b"12") in start["headers"]
            assert caller.body == b'{"ok": true}'
        assert peer.connections == 1 and len(peer.heads) == 3
        head = peer.heads[0].lower()
        assert b"x-test: 1\r\n" in head and b"authorization" not in head and b"host: router" not in head
    await client.close()


async def test_a_stream_is_passed_on_piece_by_piece():
    go = asyncio.Event()
    head, a, b, end = chunked(b"data: a\n\n", b"data: b\n\n")(b"")
    peer = Peer(lambda _: [head + a, b + end], wait=go)
    client = Client()
    async with peer as url:
        caller = Caller()
        task = asyncio.ensure_future(_forward(client, url, caller))
        await asyncio.wait_for(caller.answered.wait(), 2.0)  # the first piece, while the runner holds the second
        assert caller.sent[0]["type"] == "http.response.start" and caller.body == b"data: a\n\n"
        go.set()
        assert await task == [1]
        assert caller.body == b"data: a\n\ndata: b\n\n" and caller.sent[-1] == {
            "type": "http.response.body", "body": b"", "more_body": False}
    await client.close()


async def test_an_answer_cut_short_and_a_refused_connection_are_the_protocols_error():
    client = Client()
    async with Peer(lambda _: [b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"], close_after=True) as url:
        caller = Caller()
        assert await _forward(client, url, caller) == [1]
        assert caller.sent[0]["status"] == 502 and CAUSE.encode() in caller.body
    ollama = Caller()  # nothing listens there now
    assert await _forward(client, url, ollama, _scope("/api/generate")) == [1]
    assert ollama.sent[0]["status"] == 500 and b"llama runner process has terminated" in ollama.body
    cut = Peer(lambda head: chunked(b"data: a\n\n")(head)[:2], close_after=True)  # the stream ends mid-way
    async with cut as url:
        caller = Caller()
        await _forward(client, url, caller)
        assert caller.body.startswith(b"data: a\n\ndata: {") and CAUSE.encode() in caller.body
    await client.close()


async def test_a_caller_that_hangs_up_mid_stream_closes_the_runners_connection_at_once():
    never = asyncio.Event()
    head, first, *rest = chunked(*[b"data: x\n\n"] * 50)(b"")
    peer = Peer(lambda _: [head + first, *rest], wait=never)  # a stream that never ends by itself
    client = Client()
    async with peer as url:
        caller = Caller(leaves=True)
        assert await _forward(client, url, caller) == [1]
        await asyncio.wait_for(peer.hung_up.wait(), 2.0)
    assert caller.sent[0]["type"] == "http.response.start" and caller.sent[1]["body"] == b"data: x\n\n"
    await client.close()


async def test_a_caller_that_hangs_up_before_the_answer_closes_the_runners_connection():
    never = asyncio.Event()
    peer = Peer(lambda _: [b""], wait=never)  # reads the request, answers nothing
    client = Client()
    async with peer as url:
        caller = Caller()
        task = asyncio.ensure_future(_forward(client, url, caller))
        await asyncio.wait_for(peer.asked.wait(), 2.0)
        caller.hang_up.set()
        assert await task == [1]
        await asyncio.wait_for(peer.hung_up.wait(), 2.0)
    assert caller.sent[0]["status"] == 499
    await client.close()
