"""A minimal HTTP/1.1 client for the router's hop to its runners: keep-alive connections on loopback, one
request at a time on each, the answer's body handed on piece by piece as it arrives.

Why not httpx: the hop is on every editor keystroke, and httpx's layers (request and response models, header
normalisation, its connection-pool state machine, per-chunk decoding) cost about a millisecond a request on a
2-core machine that is also running the model. The peer is always a runner, i.e. our own `localspec serve`
under uvicorn, so the client needs only what uvicorn sends: a status line, headers, then a body framed by
Content-Length, by chunked transfer encoding, or by the connection's close.

Idle connections are dropped after IDLE_S, before uvicorn's keep-alive timeout (5 s) closes them from the other
end; a reused connection that fails before any byte of the answer (the runner closed it first) is retried once
on a fresh one, which is safe because such a request was never read.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Generator
from urllib.parse import urlsplit

IDLE_S = 4.0  # an idle connection older than this is not reused (uvicorn closes its end after 5 s)
HEAD_LIMIT = 1 << 16  # a response head larger than this is not a runner's
Headers = list[tuple[bytes, bytes]]


class UpstreamBroken(Exception):
    """The connection to the runner failed or closed before the answer was complete."""


@dataclass(eq=False)
class _Conn:
    key: tuple[str, int]
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0

    def close(self) -> None:
        self.writer.transport.abort()  # no FIN handshake to wait for: the peer reads it as a disconnect


@dataclass(eq=False)
class Reply:
    """A runner's answer: its status and headers, then its body from `pieces()` or `read()`, once. The
    connection goes back to the pool when the body has been read to its end, and is closed otherwise."""

    status: int
    headers: Headers
    _conn: _Conn
    _pool: "Upstreams"
    _length: int | None  # Content-Length; None: chunked (_chunked) or until the connection closes
    _chunked: bool
    _keep: bool
    _done: bool = field(default=False)

    def header(self, name: bytes) -> bytes:
        return next((v for k, v in self.headers if k == name), b"")

    async def pieces(self) -> AsyncIterator[bytes]:
        """The body as it arrives (chunked framing removed). Raises UpstreamBroken if it is cut short."""
        try:
            if self._chunked:
                async for piece in self._chunks():
                    yield piece
            elif self._length is not None:
                if self._length:
                    yield await self._conn.reader.readexactly(self._length)
            else:
                while piece := await self._conn.reader.read(1 << 16):
                    yield piece
                self._keep = False
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            self._keep = False
            raise UpstreamBroken(str(e) or type(e).__name__) from None
        self._done = True

    async def _chunks(self) -> AsyncIterator[bytes]:
        """The chunks' payloads, those that arrived together joined into one piece: a verify pass that accepts
        several tokens sends their events at once, and the caller then gets them in one write, not one each."""
        reader, buf = self._conn.reader, b""
        while True:
            joined, buf, ended = _unchunk(buf)
            if joined:
                yield joined
            if ended:
                return
            more = await reader.read(1 << 16)
            if not more:
                raise asyncio.IncompleteReadError(buf, None)
            buf += more

    async def read(self) -> bytes:
        return b"".join([p async for p in self.pieces()])

    def close(self) -> None:
        """Hand the connection back if the answer was read to its end, else close it (which a runner reads
        as the caller hanging up, and stops generating)."""
        conn, self._conn = self._conn, None  # type: ignore[assignment]
        if conn is None:
            return
        if self._done and self._keep:
            self._pool.put(conn)
        else:
            conn.close()

    def abort(self) -> None:
        """Close the connection now, from anywhere (the caller hung up): a pending read raises."""
        if self._conn is not None:
            self._keep = False
            self._conn.close()


class Sent:
    """A request on its way to a runner (Upstreams.send wrote it): await it for the answer's head (a Reply).
    `abort()`, from anywhere, closes its connection (the caller hung up), and the await raises UpstreamBroken."""

    def __init__(self, pool: "Upstreams", key: tuple[str, int], data: bytes, method: str,
                 conn: _Conn | None) -> None:
        self._pool, self._key, self._data, self._method, self._conn = pool, key, data, method, conn
        self.aborted = False

    def __await__(self) -> Generator[Any, None, Reply]:
        return self.reply().__await__()

    async def reply(self) -> Reply:
        """The answer's head. A reused connection that fails before any byte of it (the runner closed it while
        it was idle, so the request was never read) is retried once on a fresh one."""
        if self._conn is not None:
            try:
                return await self._head()
            except UpstreamBroken:
                if self.aborted:
                    raise
        self._conn = await _connect(self._key)
        if self.aborted:  # the caller left while this connected
            self._conn.close()
            raise UpstreamBroken("the caller hung up")
        try:
            self._conn.writer.write(self._data)
        except OSError as e:
            self._conn.close()
            raise UpstreamBroken(str(e) or type(e).__name__) from None
        return await self._head()

    async def _head(self) -> Reply:
        conn = self._conn
        assert conn is not None
        try:
            raw = await conn.reader.readuntil(b"\r\n\r\n")
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError) as e:
            conn.close()
            raise UpstreamBroken(str(e) or type(e).__name__) from None
        except BaseException:
            conn.close()
            raise
        status, headers = _parse_head(raw)
        length, chunked, keep = _framing(status, headers, self._method)
        return Reply(status, headers, conn, self._pool, length, chunked, keep)

    def abort(self) -> None:
        self.aborted = True
        if self._conn is not None:
            self._conn.close()


class Upstreams:
    """Keep-alive connections to the runners, by (host, port)."""

    def __init__(self) -> None:
        self._idle: dict[tuple[str, int], list[_Conn]] = {}

    def send(self, url: str, method: str, target: str, headers: Headers, body: bytes) -> Sent:
        """Write one request now, on an idle connection when there is one, and return it to await the answer's
        head. Nothing here waits: on 2 cores the request must be on its way to the runner before this process
        does anything else (docs/bench/router.md#router-hop). The await raises UpstreamBroken (refused, reset,
        closed)."""
        key = _address(url)
        data = _request_head(method, target, key, headers, len(body)) + body
        conn = self._take(key)
        if conn is not None:
            try:
                conn.writer.write(data)
            except OSError:
                conn.close()
                conn = None
        return Sent(self, key, data, method, conn)

    def _take(self, key: tuple[str, int]) -> _Conn | None:
        idle = self._idle.get(key)
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if now - conn.idle_since < IDLE_S and not conn.reader.at_eof():
                return conn
            conn.close()
        return None

    def put(self, conn: _Conn) -> None:
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.key, []).append(conn)

    def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()


@functools.lru_cache(maxsize=64)
def _address(url: str) -> tuple[str, int]:
    where = urlsplit(url)
    return where.hostname or "127.0.0.1", where.port or 80


async def _connect(key: tuple[str, int]) -> _Conn:
    try:
        reader, writer = await asyncio.open_connection(*key, limit=HEAD_LIMIT)
    except OSError as e:
        raise UpstreamBroken(str(e) or type(e).__name__) from None
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # each SSE event leaves at once
    return _Conn(key, reader, writer)


def _unchunk(buf: bytes) -> tuple[bytes, bytes, bool]:
    """The complete chunks at the start of `buf` (RFC 9112 7.1): (their payloads joined, the bytes left, whether
    the last chunk and its trailers were read). Raises ValueError for bytes that are not chunked framing."""
    out: list[bytes] = []
    while (eol := buf.find(b"\r\n")) >= 0:
        size = int(buf[:eol].split(b";", 1)[0], 16)
        if size == 0:
            end = buf.find(b"\r\n\r\n", eol)  # the trailers (usually none), then an empty line
            if end < 0:
                break
            return b"".join(out), buf[end + 4:], True
        start = eol + 2
        if len(buf) < start + size + 2:
            break
        if buf[start + size:start + size + 2] != b"\r\n":
            raise ValueError("a chunk not followed by CRLF")
        out.append(buf[start:start + size])
        buf = buf[start + size + 2:]
    return b"".join(out), buf, False


def _request_head(method: str, target: str, key: tuple[str, int], headers: Headers, n_body: int) -> bytes:
    lines = [f"{method} {target} HTTP/1.1\r\nhost: {key[0]}:{key[1]}\r\ncontent-length: {n_body}\r\n".encode()]
    lines += [k + b": " + v + b"\r\n" for k, v in headers]
    return b"".join(lines) + b"\r\n"


def _parse_head(raw: bytes) -> tuple[int, Headers]:
    lines = raw[:-4].split(b"\r\n")
    try:
        status = int(lines[0].split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise UpstreamBroken(f"not an HTTP answer: {lines[0][:80]!r}") from None
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers.append((name.strip().lower(), value.strip()))
    return status, headers


def _framing(status: int, headers: Headers, method: str) -> tuple[int | None, bool, bool]:
    """(Content-Length, chunked, keep-alive) from the head (RFC 9112 6.3)."""
    values = dict(headers)
    keep = values.get(b"connection", b"").lower() != b"close"
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return 0, False, keep
    if b"chunked" in values.get(b"transfer-encoding", b"").lower():
        return None, True, keep
    if b"content-length" in values:
        return int(values[b"content-length"]), False, keep
    return None, False, False
