"""Router mode's load queue: with --models-max reached and every loaded model busy, a request for another model
waits its turn, first in, first out, as llama-server's router queues it (its test_router_queue_is_fifo and
test_router_queue_two_waiters_share_one_eviction), instead of a 503.

Three levels: the queue alone with hand-made admissions; the pool with real runner processes on SmolLM2; and a
real `localspec serve` router on a real port, whose callers hold a model busy with a stream, queue two others,
and hang up while queued.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
from servers import ServerProcess

from localspec.router.discover import ModelSpec
from localspec.router.pool import LOADED, UNLOADED, Pool
from localspec.router.queue import LoadQueue
from localspec.router.refusals import WontFit

RUNNER_ARGS = ("--no-spec", "--ctx", "256", "--threads", "1")


async def _until(check: Callable[[], bool], wait: float = 120.0) -> bool:
    """Whether `check` comes true within `wait` seconds, asked again while the event loop runs other tasks."""
    deadline = time.monotonic() + wait
    while not check():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.01)
    return True


# -- the queue alone ----------------------------------------------------------------------------------------------

class Room:
    """One place to load into; an admission takes it, and the test frees it."""

    def __init__(self) -> None:
        self.free = False
        self.admitted: list[str] = []

    def admit(self, name: str) -> Callable[[], Any]:
        async def admit() -> str | None:
            if not self.free:
                return f"cannot load {name}: busy"
            self.free = False
            self.admitted.append(name)
            return None
        return admit


async def test_the_queue_lets_models_through_in_arrival_order():
    q, room = LoadQueue(), Room()
    turns = {n: asyncio.ensure_future(q.turn(n, room.admit(n), 60)) for n in ("b", "c", "d")}
    assert await _until(lambda: q.waiting == ["b", "c", "d"])
    for name in ("b", "c", "d"):
        room.free = True
        q.changed()
        await turns[name]
        assert room.admitted[-1] == name and not any(turns[n].done() for n in turns if n > name)
    assert q.waiting == [] and room.admitted == ["b", "c", "d"]


async def test_a_wait_is_bounded_and_a_waiter_that_leaves_gives_its_place_up():
    q, room = LoadQueue(), Room()
    with pytest.raises(WontFit, match=r"cannot load b: busy \(waited 0.05 s in the load queue\)"):
        await q.turn("b", room.admit("b"), 0.05)
    first = asyncio.ensure_future(q.turn("b", room.admit("b"), 60))
    second = asyncio.ensure_future(q.turn("c", room.admit("c"), 60))
    assert await _until(lambda: q.waiting == ["b", "c"])
    first.cancel()
    assert await _until(lambda: q.waiting == ["c"])
    room.free = True
    q.changed()
    await second
    assert room.admitted == ["c"] and first.cancelled()


async def test_an_admission_that_cannot_ever_fit_refuses_at_once():
    q = LoadQueue()

    async def never() -> str | None:
        raise WontFit("cannot load b: needs more memory than this machine has")

    with pytest.raises(WontFit, match="more memory"):
        await q.turn("b", never, 60)
    assert q.waiting == []


# -- the pool, real runners ---------------------------------------------------------------------------------------

def _pool(path: Path, names: str, **kw: Any) -> Pool:
    specs = [ModelSpec(n, path, ("--model", str(path), *RUNNER_ARGS), "models dir", n_ctx=256, ngl=0) for n in names]
    return Pool(specs, models_max=1, default_keep_alive=-1, **kw)


def _states(pool: Pool) -> dict[str, str]:
    return {s.name: s.state for s in pool.status()}


@pytest.mark.slow
async def test_waiters_get_their_models_first_in_first_out_as_busy_models_free_up(smollm2_path):
    pool = _pool(smollm2_path, "abc")
    try:
        a = await pool.acquire("a")
        b1, b2 = asyncio.ensure_future(pool.acquire("b")), asyncio.ensure_future(pool.acquire("b"))
        assert await _until(lambda: pool.queued() == ["b"])  # two requests for b: one place, one load
        c = asyncio.ensure_future(pool.acquire("c"))
        assert await _until(lambda: pool.queued() == ["b", "c"])
        assert _states(pool) == {"a": LOADED, "b": UNLOADED, "c": UNLOADED}
        pool.release(a)  # a is idle: b's turn evicts it
        rb, twin = await b1, await b2
        assert rb is twin and _states(pool) == {"a": UNLOADED, "b": LOADED, "c": UNLOADED}
        assert pool.queued() == ["c"] and not c.done()
        pool.release(rb)
        assert not c.done()  # b still serves its twin request
        pool.release(twin)
        rc = await c
        assert _states(pool) == {"a": UNLOADED, "b": UNLOADED, "c": LOADED} and pool.queued() == []
        pool.release(rc)
    finally:
        await pool.close()


@pytest.mark.slow
async def test_a_waiter_that_leaves_the_queue_leaves_the_busy_model_loaded(smollm2_path):
    pool = _pool(smollm2_path, "ab", queue_wait_s=0.2)
    try:
        a = await pool.acquire("a")
        waiter = asyncio.ensure_future(pool.acquire("b"))
        assert await _until(lambda: pool.queued() == ["b"])
        waiter.cancel()
        assert await _until(lambda: pool.queued() == [])
        pool.release(a)
        assert _states(pool) == {"a": LOADED, "b": UNLOADED}  # nobody wants b now: a is not evicted for it
        a = await pool.acquire("a")
        with pytest.raises(WontFit, match=r"models are running and busy \(--models-max 1\) \(waited 0.2 s"):
            await pool.acquire("b")
        assert _states(pool) == {"a": LOADED, "b": UNLOADED} and pool.queued() == []
        pool.release(a)
    finally:
        await pool.close()


# -- a real router ------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def router(tmp_path_factory, smollm2_path) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("queue")
    presets = root / "models.ini"  # three names for one file (a folder would list the file once)
    presets.write_text("".join(f"[{name}]\nmodel = {smollm2_path}\n\n" for name in ("qa", "qb", "qc")))
    env = {"HF_HUB_CACHE": str(root / "hf"), "HF_HUB_OFFLINE": "1", "LOCALSPEC_HOME": str(root / "home"),
           "LOCALSPEC_CACHE": os.environ.get("LOCALSPEC_CACHE", str(root / "cache"))}
    with ServerProcess(["--models-preset", str(presets), "--models-max", "1", "--ctx", "4096", "--threads", "1",
                        "--no-spec"], env=env) as srv:
        yield srv
        assert srv.alive, "".join(srv.log[-30:])


def _logged(srv: ServerProcess, text: str, wait: float = 120.0) -> bool:
    """Whether the router printed a line holding `text` within `wait` seconds."""
    deadline = time.monotonic() + wait
    while not any(text in line for line in srv.log):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _status(url: str, name: str) -> str:
    models = httpx.get(url + "/models", timeout=30).json()["data"]
    return next(m["status"]["value"] for m in models if m["id"] == name)


class Busy:
    """A stream on a model, held open (the model stays busy) until `close`; the caller's hang-up ends it."""

    def __init__(self, url: str, model: str) -> None:
        self.client = httpx.Client(base_url=url, timeout=600)
        body = {"model": model, "prompt": "Count to a thousand:", "n_predict": 4000, "stream": True,
                "logit_bias": [[0, False], [1, False], [2, False]]}  # SmolLM2's special tokens: it never ends
        self.stream = self.client.stream("POST", "/completion", json=body)
        self.reply = self.stream.__enter__()
        assert self.reply.status_code == 200, self.reply.read()
        self.lines = self.reply.iter_lines()  # kept: a collected iterator closes the stream
        next(self.lines)  # its first event: the model is loaded and generating

    def close(self) -> None:
        self.stream.__exit__(None, None, None)
        self.client.close()


class Later:
    """A request in a thread, with the time its answer came."""

    def __init__(self, url: str, model: str) -> None:
        self.status, self.done_at = 0, 0.0
        self.thread = threading.Thread(target=self._run, args=(url, model), daemon=True)
        self.thread.start()

    def _run(self, url: str, model: str) -> None:
        r = httpx.post(url + "/completion", json={"model": model, "prompt": "Hi", "n_predict": 2}, timeout=600)
        self.status, self.done_at = r.status_code, time.monotonic()

    def join(self) -> int:
        self.thread.join(600)
        return self.status


@pytest.mark.slow
def test_the_router_queues_requests_first_in_first_out(router):
    busy = Busy(router.url, "qa")
    first = Later(router.url, "qb")
    assert _logged(router, "router: qb waits in the load queue, position 1"), "".join(router.log[-30:])
    second = Later(router.url, "qc")
    assert _logged(router, "router: qc waits in the load queue, position 2")
    busy.close()  # qa is idle: qb's turn evicts it
    assert first.join() == 200 and second.join() == 200
    assert first.done_at < second.done_at
    assert _status(router.url, "qa") == "unloaded" and _status(router.url, "qc") == "loaded"


@pytest.mark.slow
def test_a_caller_that_hangs_up_in_the_queue_leaves_it(router):
    busy = Busy(router.url, "qc")
    host, port = router.url.removeprefix("http://").split(":")
    body = b'{"model": "qa", "prompt": "Hi", "n_predict": 2}'
    with socket.create_connection((host, int(port))) as caller:
        caller.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert _logged(router, "router: qa waits in the load queue, position 1")
    assert _logged(router, "router: qa left the load queue")
    busy.close()
    assert _status(router.url, "qc") == "loaded" and _status(router.url, "qa") == "unloaded"
