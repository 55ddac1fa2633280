"""A real `localspec serve` (SmolLM2-135M, port 0, with an API key) against the requests that killed, held or
broke it: each is a 4xx naming its cause, and after each the server answers a well-formed request.

One server for the module: the cases follow each other as a client's would, and each asserts the server is
alive and free afterwards.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from urllib.parse import urlsplit

import pytest
from servers import ServerProcess

KEY = "hostile-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
LIMIT = 1 << 20  # this server's body limit (LOCALSPEC_MAX_BODY_BYTES), so a test body need not be 16 MiB
DEADLINE_S = 60.0  # a hang, not a speed limit


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--api-key", KEY, "--ctx", "1024"], env={"LOCALSPEC_MAX_BODY_BYTES": str(LIMIT)}) as srv:
        yield srv


def post(url: str, path: str, body: dict | bytes, headers: dict | None = None,
         timeout: float = DEADLINE_S) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, headers={**AUTH, **(headers or {})}, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def message(body: dict) -> str:
    err = body.get("error")
    return err.get("message", "") if isinstance(err, dict) else str(err)


def still_answers(url: str) -> None:
    """The worker is free: a small generation answers within the deadline."""
    status, body = post(url, "/completion", {"prompt": "Hello", "n_predict": 2})
    assert status == 200 and "content" in body


@pytest.mark.slow
@pytest.mark.parametrize("grammar, words", [
    ('root ::= "a"{5,1}', "lower bound"),  # killed the process (OOM) before
    ('root ::= "a"{1,0}', "lower bound"),
    ("root ::= " + " ".join(['("a"?)'] * 2000), "too wide"),  # held the worker for more than 7 minutes
    ("root ::= " + " | ".join(f'"w{i}"' for i in range(50_000)), "too wide"),  # 49 s for 4 tokens
    ('root ::= "\\U99999999"', "U+10FFFF"),  # a 500 with a traceback (ConstraintBroken)
], ids=["5,1", "1,0", "optional-run", "alternatives-50k", "past-unicode"])
def test_a_hostile_grammar_is_a_400_naming_its_limit(server, grammar, words):
    for path, body in (("/completion", {"prompt": "x", "n_predict": 4, "grammar": grammar}),
                       ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                                                 "grammar": grammar})):
        status, answer = post(server.url, path, body)
        assert status == 400 and words in message(answer), (path, status, answer)
    still_answers(server.url)


@pytest.mark.slow
def test_a_huge_enum_is_a_400(server):
    schema = {"enum": [f"value {i}" for i in range(10_000)]}
    status, answer = post(server.url, "/completion", {"prompt": "x", "n_predict": 4, "json_schema": schema})
    assert status == 400 and "too wide" in message(answer)
    still_answers(server.url)


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/chat/completions", "/apply-template"])
@pytest.mark.parametrize("name", ["messages", "template", "now"])
def test_chat_template_kwargs_that_collide_are_a_400(server, path, name):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "chat_template_kwargs": {name: "x"}}
    status, answer = post(server.url, path, body)
    assert status == 400 and name in message(answer), answer


@pytest.mark.slow
def test_a_body_over_the_limit_is_a_413_before_it_is_read(server):
    """Refused from its declared length: the client learns it before sending the body (a client that sends it
    anyway may find the connection closed under it; tests/test_hostile_http.py covers a chunked body)."""
    host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
    with socket.create_connection((host, port), timeout=DEADLINE_S) as s:
        s.sendall(f"POST /completion HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                  f"Content-Length: {LIMIT + 10}\r\n\r\n".encode())
        answer = b""
        while chunk := s.recv(65536):  # the server closes after its answer
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 413") and str(LIMIT).encode() in answer
    still_answers(server.url)


@pytest.mark.slow
def test_the_key_guards_the_limit(server):
    """A client without the key is refused from its head, before its body is read (401, not 413)."""
    host, port = urlsplit(server.url).hostname, urlsplit(server.url).port
    with socket.create_connection((host, port), timeout=DEADLINE_S) as s:
        s.sendall(f"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: {LIMIT * 100}\r\n\r\n".encode())
        assert s.recv(65536).startswith(b"HTTP/1.1 401")


@pytest.mark.slow
def test_tokenize_leaves_the_event_loop_free(server):
    """/health answers while /tokenize works through a large text (it ran on the event loop: 14 s for 5 MB)."""
    text = "word " * (LIMIT // 5 - 100)
    done: list[float] = []

    def tokenize() -> None:
        post(server.url, "/tokenize", {"content": text})
        done.append(time.monotonic())

    t = threading.Thread(target=tokenize)
    t.start()
    time.sleep(0.3)  # the request is in
    with urllib.request.urlopen(server.url + "/health", timeout=DEADLINE_S) as r:
        answered = time.monotonic()
        assert r.status == 200
    t.join(DEADLINE_S)
    assert done and answered <= done[0]


def _half_sent(url: str, n: int) -> list[socket.socket]:
    host, port = urlsplit(url).hostname, urlsplit(url).port
    socks = []
    for i in range(n):
        s = socket.create_connection((host, port))
        s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\n" if i % 2 else b"GET /hea")
        socks.append(s)
    return socks


@pytest.mark.slow
def test_half_sent_heads_are_closed_after_the_head_timeout(server):
    from localspec.server.limits import HEAD_TIMEOUT_S

    socks = _half_sent(server.url, 20)
    try:
        time.sleep(HEAD_TIMEOUT_S + 3)
        for s in socks:
            s.settimeout(5)
            assert s.recv(1024) == b""  # closed by the server, with nothing sent
    finally:
        for s in socks:
            s.close()
    still_answers(server.url)
