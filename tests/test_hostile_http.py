"""The HTTP limits without a model: a body over the limit is a 413, a body that stops is a 408, a half-sent head
is closed after its deadline, on a real uvicorn on port 0 with localspec's protocol and middleware."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from typing import Any

import pytest

from localspec.server.limits import BodyLimitMiddleware, timed_protocol

LIMIT = 1000


async def echo(scope: dict, receive: Any, send: Any) -> None:
    """An app that reads the body and answers its length, then waits for the client's disconnect message."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            pass
        return
    body = b""
    while True:
        m = await receive()
        body += m.get("body", b"")
        if not m.get("more_body"):
            break
    data = json.dumps({"n": len(body)}).encode()
    headers = [(b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": data})


@pytest.fixture(scope="module")
def url():
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    protocol = timed_protocol(AutoHTTPProtocol)
    protocol.head_timeout = 0.5
    app = BodyLimitMiddleware(echo, limit=LIMIT, timeout=0.5)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, http=protocol, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield f"127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)


def exchange(url: str, raw: bytes, wait: float = 5.0) -> bytes:
    host, port = url.split(":")
    with socket.create_connection((host, int(port)), timeout=wait) as s:
        s.sendall(raw)
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except socket.timeout:
            pass
        return out


def request(body: bytes, *, length: int | None = None, chunked: bool = False) -> bytes:
    if chunked:
        head = b"POST /completion HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        return head + f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n\r\n"
    n = len(body) if length is None else length
    return f"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n".encode() + body


def test_a_body_within_the_limit_reaches_the_app_whole(url):
    out = exchange(url, request(b"x" * LIMIT))
    assert out.startswith(b"HTTP/1.1 200") and out.endswith(b'{"n": 1000}')


def test_a_declared_length_over_the_limit_is_a_413_before_the_body(url):
    out = exchange(url, request(b"", length=10**12))
    assert out.startswith(b"HTTP/1.1 413") and b"request_too_large" in out and str(LIMIT).encode() in out


def test_a_chunked_body_over_the_limit_is_a_413(url):
    out = exchange(url, request(b"y" * (LIMIT + 1), chunked=True))
    assert out.startswith(b"HTTP/1.1 413")


def test_a_body_that_stops_is_a_408(url):
    out = exchange(url, request(b"x" * 10, length=100))  # 90 bytes never come
    assert out.startswith(b"HTTP/1.1 408") and b"paused" in out


def test_an_error_under_api_is_ollamas_shape(url):
    raw = request(b"", length=10**9).replace(b"/completion", b"/api/generate")
    body = exchange(url, raw).split(b"\r\n\r\n", 1)[1]
    assert json.loads(body)["error"].startswith("the request body is")


@pytest.mark.parametrize("head", [b"", b"GET /hea", b"POST /completion HTTP/1.1\r\nHost: x\r\n"])
def test_a_half_sent_head_is_closed_after_the_head_timeout(url, head):
    host, port = url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(head)
        start = time.monotonic()
        assert s.recv(1024) == b""  # closed, nothing answered
        assert time.monotonic() - start < 9  # the deadline, not the socket's own timeout


def test_a_keep_alive_connection_gets_the_same_deadline_after_its_answer(url):
    host, port = url.split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab")
        time.sleep(0.2)
        assert s.recv(65536).startswith(b"HTTP/1.1 200")
        s.sendall(b"POST /completion HTTP/1.1\r\nHo")  # the next head stops half-way
        assert s.recv(1024) == b""


def test_a_slow_answer_is_not_cut_by_the_head_timeout():
    """The deadline is on the head only: an app that takes longer than it to answer still answers."""
    import uvicorn
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    async def slow(scope: dict, receive: Any, send: Any) -> None:
        await asyncio.sleep(1.0)
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    protocol = timed_protocol(AutoHTTPProtocol)
    protocol.head_timeout = 0.3
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(slow, http=protocol, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.01)
        out = exchange(f"127.0.0.1:{sock.getsockname()[1]}", b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert out.startswith(b"HTTP/1.1 200") and out.endswith(b"ok")
    finally:
        server.should_exit = True
        thread.join(10)
