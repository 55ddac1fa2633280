"""Router mode against a local client that walks around its key: each runner listens on 127.0.0.1 and answers
only the router, which hands it a secret of its own; half-sent heads do not hold the router's descriptors."""

from __future__ import annotations

import os
import re
import socket
import time
from pathlib import Path

import httpx
import pytest
from servers import ServerProcess

KEY = "router-test-key"
RUNNER_ARGS = ("--no-spec", "--ctx", "256", "--threads", "1")


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("router")
    (tmp / "models").mkdir()
    env = {"HF_HUB_CACHE": str(tmp / "hf"), "HF_HUB_OFFLINE": "1", "LOCALSPEC_HOME": str(tmp / "home")}
    with ServerProcess(["--models-dir", str(tmp / "models"), "--api-key", KEY, *RUNNER_ARGS], env=env) as srv:
        yield srv


def _runner_url(srv: ServerProcess) -> str:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for line in srv.log:
            if m := re.search(r"router: \S+ loaded \(pid \d+, (http://127\.0\.0\.1:\d+)\)", line):
                return m.group(1)
        time.sleep(0.1)
    raise AssertionError("no runner loaded:\n" + "".join(srv.log[-20:]))


@pytest.mark.slow
def test_a_runner_answers_its_router_alone(router):
    from localspec.models.registry import load_registry

    body = {"model": load_registry().default, "prompt": "Hi", "n_predict": 2}
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.post(router.url + "/completion", json=body, headers=auth, timeout=300).status_code == 200
    assert httpx.post(router.url + "/completion", json=body, timeout=60).status_code == 401
    runner = _runner_url(router)
    for headers in ({}, auth, {"X-Api-Key": KEY}):  # the router's own key is no key to a runner
        assert httpx.post(runner + "/completion", json=body, headers=headers, timeout=60).status_code == 401
        assert httpx.get(runner + "/v1/models", headers=headers, timeout=60).status_code == 401
    assert httpx.get(runner + "/health", timeout=60).status_code == 200  # liveness stays public, as llama-server's
    assert httpx.post(router.url + "/completion", json=body, headers=auth, timeout=300).status_code == 200


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _router_pid(srv: ServerProcess) -> int:
    """The router process: the watching parent's child (`localspec serve` runs in a watched child)."""
    assert srv.proc is not None
    kids = Path(f"/proc/{srv.proc.pid}/task/{srv.proc.pid}/children").read_text().split()
    return int(kids[0]) if kids else srv.proc.pid


@pytest.mark.slow
def test_half_sent_heads_do_not_hold_the_routers_descriptors(router):
    from localspec.server.limits import HEAD_TIMEOUT_S

    pid = _router_pid(router)
    before = _fds(pid)
    host, port = router.url.removeprefix("http://").split(":")
    socks = [socket.create_connection((host, int(port))) for _ in range(50)]
    for i, s in enumerate(socks):
        s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\n" if i % 2 else b"GET /hea")
    try:
        time.sleep(0.5)
        assert _fds(pid) >= before + 40  # they are open now
        time.sleep(HEAD_TIMEOUT_S + 2)
        for s in socks:
            s.settimeout(5)
            assert s.recv(1024) == b""
    finally:
        for s in socks:
            s.close()
    time.sleep(0.5)
    assert _fds(pid) <= before + 2
    assert httpx.get(router.url + "/health", timeout=60).status_code == 200


@pytest.mark.slow
def test_deeply_nested_json_is_a_400_from_the_router(router):
    """The router reads each body's `model`: 100,000 nested brackets were a RecursionError there, a 500."""
    body = b'{"prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    r = httpx.post(router.url + "/completion", content=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60)
    assert r.status_code == 400 and "nested too deeply" in r.json()["error"]["message"]
