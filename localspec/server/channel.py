"""The channel between the router and a runner for hand-offs (router/handoff.py, server/handoff.py): its
messages, a writer that keeps them whole and in order, and the page that says how far an answer got.

The wire, on a Unix socket pair the router makes for each runner (both ends are this package, run by the same
Python, so `marshal` serialises):
- router -> runner, one message per request: HEAD (MAGIC, id, length of the request's meta, length of its body),
  the meta (method, path, headers, ... as marshal), the body. The caller's socket rides on the message's first
  bytes; a stream socket keeps messages that carry a descriptor apart, so descriptors pair with messages in order.
- runner -> router: DONE (id, whether the connection may be kept, the length of what the caller sent after the
  request) and those bytes, once the answer has left the runner; the router then reads the connection again.

How far an answer got, for a runner that dies mid-answer: one byte per request slot (`slot(id)`) in a page of
SLOTS bytes both map, written by the runner before each step (NOTHING, CHUNKED, LENGTH, COMPLETE); the router
reads it only after a crash, to end the answer in the right framing.
"""

from __future__ import annotations

import asyncio
import collections
import marshal
import socket
import struct
from typing import Any, Sequence

MAGIC = b"LSH1"
HANDED_OVER = "localspec.handed_over"  # the scope extension of a request answered on a handed-over connection
HEAD = struct.Struct("!4sIII")  # magic, request id, meta length, body length
DONE = struct.Struct("!IBI")  # request id, keep the connection, length of the caller's bytes that follow
SLOTS = 4096  # the progress page: one byte per request id modulo this
NOTHING, CHUNKED, LENGTH, COMPLETE = 0, 1, 2, 3  # what a runner has written of an answer


def slot(request_id: int) -> int:
    return request_id % SLOTS


def encode_request(request_id: int, scope: dict, body: bytes) -> bytes:
    """One request, as the router read it (its ASGI scope and whole body), for the runner."""
    meta = marshal.dumps((scope["method"], scope["path"], scope.get("raw_path") or scope["path"].encode(),
                          scope.get("query_string") or b"", list(scope["headers"]), scope.get("client"),
                          scope.get("server"), scope.get("http_version", "1.1")))
    return HEAD.pack(MAGIC, request_id, len(meta), len(body)) + meta + body


def decode_scope(meta: bytes) -> dict[str, Any]:
    method, path, raw_path, query, headers, client, server, version = marshal.loads(meta)
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": version,
            "method": method, "scheme": "http", "path": path, "raw_path": raw_path, "query_string": query,
            "root_path": "", "headers": [tuple(h) for h in headers], "client": tuple(client) if client else None,
            "server": tuple(server) if server else None, "state": {}, "extensions": {HANDED_OVER: {}}}


def chunk(data: bytes) -> bytes:
    """One piece of a chunked HTTP/1.1 body (RFC 9112 7.1)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def received(sock: socket.socket) -> bytes | None:
    """What a readable non-blocking socket holds: None when nothing after all, b"" when the other end closed."""
    try:
        return sock.recv(1 << 16)
    except (BlockingIOError, InterruptedError):
        return None
    except OSError:
        return b""


class Outbox:
    """Messages on a non-blocking Unix socket, in order: written at once when the socket takes them, the rest
    when it is writable again. Descriptors go with their message's first bytes."""

    def __init__(self, sock: socket.socket, loop: asyncio.AbstractEventLoop) -> None:
        self.sock, self.loop, self.fd = sock, loop, sock.fileno()
        self._queue: collections.deque[tuple[memoryview, list[int]]] = collections.deque()
        self._waiting = False  # a writer callback is registered

    def put(self, data: bytes, fds: Sequence[int] = ()) -> None:
        """Raises OSError (BrokenPipeError: the other process is gone, or the channel is closed)."""
        if self.sock.fileno() < 0:
            raise BrokenPipeError("the hand-off channel is closed")
        self._queue.append((memoryview(data), list(fds)))
        if len(self._queue) == 1:
            self._flush()

    def _flush(self) -> None:
        while self._queue:
            data, fds = self._queue[0]
            try:
                sent = self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack(
                    f"{len(fds)}i", *fds))] if fds else [])
            except (BlockingIOError, InterruptedError):
                if not self._waiting:
                    self._waiting = True
                    self.loop.add_writer(self.fd, self._writable)
                return
            except OSError:
                self._queue.clear()
                self._stop_waiting()
                raise
            self._queue[0] = (data[sent:], [])
            if sent == len(data):
                self._queue.popleft()
        self._stop_waiting()

    def _stop_waiting(self) -> None:
        if self._waiting:
            self._waiting = False
            self.loop.remove_writer(self.fd)

    def _writable(self) -> None:
        try:
            self._flush()
        except OSError:  # the other process is gone: its end of the channel says so to the reader
            pass
