"""The channel between the router and a runner for hand-offs (router/handoff.py, server/handoff.py): its
messages, a writer that keeps them whole and in order, and the page that says how far an answer got.

The wire, on a Unix socket pair the router makes for each runner (both ends are this package, run by the same
Python, so `marshal` serialises):
- router -> runner, one message per request: HEAD (MAGIC, id, length of the request's meta, length of its body),
  the meta (method, path, headers, ..., and the hold key, as marshal), the body. The caller's socket rides on the
  message's first bytes; a stream socket keeps messages that carry a descriptor apart, so descriptors pair with
  messages in order. Id 0 with nothing after it is RECALL: give back every connection held idle.
- runner -> router, NOTE (id, what, length of the bytes that follow):
  - CLOSE or KEEP, with what the caller sent after its request: the connection is given back, once the answer
    has left the runner (KEEP: the router reads it again; CLOSE: the router closes it);
  - IDLE: the answer is done and the runner holds the connection for the caller's next request (the router
    releases the model);
  - BUSY: the caller's next request on a held connection is for this runner, which answers it (the router takes
    the model again);
  - RECALLED (id 0): every connection that was held idle has been given back.

A connection is held when the request that came with it carries a hold key (`hold_key`): its path, its model
and its credentials. The caller's next request is the runner's to answer only if it matches (`matches`);
anything else goes back to the router unread by the app, which routes it as any request.

How far an answer got, for a runner that dies mid-answer: one byte per request slot (`slot(id)`) in a page of
SLOTS bytes both map, written by the runner before each step (NOTHING, CHUNKED, LENGTH, COMPLETE, or HELD while
it waits for the caller's next request); the router reads it only after a crash, to end the answer in the
right framing, or to read a held connection again itself.
"""

from __future__ import annotations

import asyncio
import collections
import json
import marshal
import socket
import struct
from typing import Any, Sequence

MAGIC = b"LSH1"
HANDED_OVER = "localspec.handed_over"  # the scope extension of a request answered on a handed-over connection
HEAD = struct.Struct("!4sIII")  # magic, request id, meta length, body length
NOTE = struct.Struct("!IBI")  # request id, what (CLOSE ... RECALLED), length of the caller's bytes that follow
CLOSE, KEEP, IDLE, BUSY, RECALLED = 0, 1, 2, 3, 4
RECALL = 0  # the request id of the router's recall
SLOTS = 4096  # the progress page: one byte per request id modulo this
NOTHING, CHUNKED, LENGTH, COMPLETE, HELD = 0, 1, 2, 3, 4  # what a runner has written of an answer
CREDENTIALS = (b"authorization", b"x-api-key")
Hold = tuple[str, str, tuple[bytes, ...]]  # path, model, credentials


def slot(request_id: int) -> int:
    return request_id % SLOTS


def encode_request(request_id: int, scope: dict, body: bytes, hold: Hold | None = None) -> bytes:
    """One request, as the router read it (its ASGI scope and whole body), for the runner; `hold`: its hold key
    when the runner may keep the connection for the caller's next requests like it."""
    meta = marshal.dumps((scope["method"], scope["path"], scope.get("raw_path") or scope["path"].encode(),
                          scope.get("query_string") or b"", [tuple(h) for h in scope["headers"]],
                          scope.get("client"), scope.get("server"), scope.get("http_version", "1.1"), hold))
    return HEAD.pack(MAGIC, request_id, len(meta), len(body)) + meta + body


def decode_request(meta: bytes) -> tuple[dict[str, Any], Hold | None]:
    """The scope and the hold key of a request the router sent (encode_request)."""
    method, path, raw_path, query, headers, client, server, version, hold = marshal.loads(meta)
    return request_scope(method, path, raw_path, query, headers, client, server, version), hold


def request_scope(method: str, path: str, raw_path: bytes, query: bytes, headers: list, client: Any, server: Any,
                  version: str) -> dict[str, Any]:
    """The ASGI scope uvicorn would give the app for this request on a handed-over connection."""
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": version,
            "method": method, "scheme": "http", "path": path, "raw_path": raw_path, "query_string": query,
            "root_path": "", "headers": headers, "client": client, "server": server, "state": {},
            "extensions": {HANDED_OVER: {}}}


def credentials(headers: Sequence[tuple[bytes, bytes]]) -> tuple[bytes, ...]:
    """What a request says of who sends it: the router's API key check read these."""
    return tuple(v for k, v in headers if k in CREDENTIALS)


def hold_key(path: str, headers: Sequence[tuple[bytes, bytes]], body: dict[str, Any]) -> Hold | None:
    """What the caller's next request must share with this one for the runner to answer it without the router:
    the path, the model named in the body, the credentials. None (not held) for a request that names no model
    (the router's choice of a default can change as models load), that sets Ollama's keep_alive (the router's
    to apply), or that comes from a browser (the router adds CORS headers)."""
    model = body.get("model")
    if not isinstance(model, str) or not model or "keep_alive" in body or any(k == b"origin" for k, _ in headers):
        return None
    return path, model, credentials(headers)


def matches(hold: Hold, method: str, path: str, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> bool:
    """Whether a request read on a held connection is the runner's to answer (the router would send it there)."""
    if method != "POST" or path != hold[0] or credentials(headers) != hold[2]:
        return False
    if any(k in (b"origin", b"expect", b"upgrade") for k, _ in headers):
        return False
    try:
        value = json.loads(body)
    except ValueError:
        return False
    return isinstance(value, dict) and hold_key(path, headers, value) == hold


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
