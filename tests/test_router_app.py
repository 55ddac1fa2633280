"""Router mode's app without models: keep_alive parsing, which model a request picks, and the errors a runner that
dies mid-answer turns into, per protocol. The runner here is a real TCP server that answers part of a response and
drops the connection, as a runner killed by a signal does; the pool is a small fake (tests/test_router_api.py
runs the real pool, runners and models)."""

from __future__ import annotations

import asyncio
import json
import signal
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator

import click
import httpx
import pytest

from localspec.crash import crash_line
from localspec.router.app import create_router_app
from localspec.router.choice import FOREVER, RouterConfig, choose_model, parse_keep_alive
from localspec.router.proxy import HangUp, error_event
from localspec.router.refusals import RunnerFailed, UnknownModel

CAUSE = crash_line(signal.SIGSEGV)


@pytest.mark.parametrize("value,seconds", [("5m", 300.0), ("1h30m", 5400.0), ("30s", 30.0), ("250ms", 0.25),
                                           (0, 0.0), ("0", 0.0), (12, 12.0), (-1, FOREVER), ("-1m", FOREVER),
                                           ("-1", FOREVER), (None, None)])
def test_keep_alive_reads_ollama_durations(value, seconds):
    assert parse_keep_alive(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "5x", True])
def test_keep_alive_refuses_what_is_not_a_duration(value):
    with pytest.raises(ValueError):
        parse_keep_alive(value)


@dataclass
class Status:
    name: str
    state: str


@dataclass
class Runner:
    """What the proxy reads of a runner: where it listens, and why it died."""

    url: str
    name: str = "a"
    alive: bool = False

    def failure(self) -> str | None:
        return CAUSE

    async def died(self, timeout: float = 2.0) -> str | None:
        return CAUSE


@dataclass
class Pool:
    names: list[str]
    runner: Runner | None = None
    loaded_names: list[str] = field(default_factory=list)
    released: list[Any] = field(default_factory=list)

    def known(self) -> list[str]:
        return list(self.names)

    def resolve(self, name: str) -> str:
        bare = name.removesuffix(":latest")
        if bare not in self.names:
            raise UnknownModel(name, self.names)
        return bare

    def loaded(self) -> list[str]:
        return list(self.loaded_names)

    def state(self, name: str) -> str:
        return "loaded" if name in self.loaded_names else "sleeping"

    def status(self) -> list[Status]:
        return [Status(n, "loaded" if n in self.loaded_names else "unloaded") for n in self.names]

    async def acquire(self, name: str, keep_alive: float | None = None) -> Runner:
        assert self.runner is not None
        return self.runner

    def release(self, runner: Runner, keep_alive: float | None = None) -> None:
        self.released.append(keep_alive)

    async def run_reaper(self) -> None:
        await asyncio.sleep(3600)

    async def close(self) -> None:
        pass


def test_a_request_without_a_model_goes_to_the_default_then_the_one_loaded_then_the_fallback():
    pool = Pool(["a", "b", "c"])
    assert choose_model(pool, RouterConfig(default_model="b"), None) == "b"
    assert choose_model(pool, RouterConfig(fallback_model="c"), None) == "c"
    pool.loaded_names = ["a"]
    assert choose_model(pool, RouterConfig(fallback_model="c"), None) == "a"
    assert choose_model(pool, RouterConfig(), "b:latest") == "b"
    with pytest.raises(UnknownModel) as e:
        choose_model(pool, RouterConfig(), "zzz")
    assert "known models: a, b, c" in str(e.value)


@pytest.mark.parametrize("path,framing", [("/v1/chat/completions", "data"), ("/completion", "data"),
                                          ("/v1/messages", "event"), ("/v1/responses", "event"),
                                          ("/api/chat", "line")])
def test_the_last_error_event_has_each_protocols_framing(path, framing):
    raw = error_event(path, 500, "boom").decode()
    if framing == "line":
        assert json.loads(raw) == {"error": "boom"} and raw.endswith("\n")
        return
    assert raw.endswith("\n\n")
    if framing == "event":
        assert raw.startswith("event: error\ndata: ")
        assert json.loads(raw.split("data: ", 1)[1])["type"] == "error"
    else:
        assert json.loads(raw[6:])["error"]["message"] == "boom"


async def _half_answer(content_type: str | None) -> tuple[asyncio.AbstractServer, str]:
    """A runner that reads the request, sends the start of a chunked answer (or nothing), then drops the
    connection, as a process killed mid-answer does."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = next((int(ln.split(b":")[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(
            b"content-length:")), 0)
        await reader.readexactly(length)
        if content_type is not None:
            piece = b'data: {"content": "par"}\n\n' if "event" in content_type else b'{"response": "par"}\n'
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: " + content_type.encode() +
                         b"\r\ntransfer-encoding: chunked\r\n\r\n" + f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            await writer.drain()
        writer.transport.abort()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def _post(app: Any, path: str, body: dict[str, Any]) -> httpx.Response:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:
        return await c.post(path, json=body)


@pytest.fixture
async def runner_at() -> AsyncIterator[Any]:
    servers: list[asyncio.AbstractServer] = []

    async def start(content_type: str | None) -> str:
        server, url = await _half_answer(content_type)
        servers.append(server)
        return url

    yield start
    for s in servers:
        s.close()


async def test_a_runner_dead_before_answering_is_a_502_naming_the_crash(runner_at):
    pool = Pool(["a"], Runner(await runner_at(None)))
    r = await _post(create_router_app(pool), "/v1/chat/completions", {"model": "a", "messages": []})
    assert r.status_code == 502
    assert r.json()["error"]["message"] == f"the runner process of model 'a' terminated: {CAUSE}"
    assert pool.released == [None]


async def test_ollama_gets_its_own_words_and_a_500(runner_at):
    pool = Pool(["a"], Runner(await runner_at(None)))
    r = await _post(create_router_app(pool), "/api/chat", {"model": "a", "messages": [], "keep_alive": "1m"})
    assert r.status_code == 500 and r.json() == {"error": f"llama runner process has terminated: {CAUSE}"}
    assert pool.released == [60.0]


async def test_a_stream_cut_short_ends_with_an_error_event(runner_at):
    pool = Pool(["a"], Runner(await runner_at("text/event-stream")))
    r = await _post(create_router_app(pool), "/v1/chat/completions", {"model": "a", "stream": True})
    assert r.status_code == 200
    events = [json.loads(ln[6:]) for ln in r.text.splitlines() if ln.startswith("data: ")]
    assert events[0] == {"content": "par"} and CAUSE in events[-1]["error"]["message"]
    assert pool.released == [None]


async def test_an_ollama_stream_cut_short_ends_with_an_error_line(runner_at):
    pool = Pool(["a"], Runner(await runner_at("application/x-ndjson")))
    r = await _post(create_router_app(pool), "/api/generate", {"model": "a", "prompt": "x"})
    lines = [json.loads(ln) for ln in r.text.splitlines()]
    assert lines[0] == {"response": "par"} and lines[-1] == {"error": f"llama runner process has terminated: {CAUSE}"}


async def test_an_unknown_model_is_a_404_in_the_routes_shape():
    pool = Pool(["a", "b"])
    r = await _post(create_router_app(pool), "/v1/chat/completions", {"model": "zzz"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert "known models: a, b" in r.json()["error"]["message"]
    o = await _post(create_router_app(pool), "/api/generate", {"model": "zzz"})
    assert o.status_code == 404 and "known models: a, b" in o.json()["error"]


class _Hangs:
    """A caller whose next ASGI message is its disconnect, after `after` seconds."""

    def __init__(self, after: float) -> None:
        self.after = after

    async def receive(self) -> dict[str, str]:
        await asyncio.sleep(self.after)
        return {"type": "http.disconnect"}


class _Upstream:
    aborted = 0

    def abort(self) -> None:
        self.aborted += 1


async def test_a_caller_that_hangs_up_closes_the_upstream_at_once_and_a_closed_watch_does_nothing():
    first, then = _Upstream(), _Upstream()
    hang_up = HangUp(_Hangs(0.01).receive, first.abort)
    hang_up.abort = then.abort  # the answer replaced the request in flight
    await asyncio.wait_for(hang_up._task, 1)
    await asyncio.sleep(0)  # the done callback runs
    assert hang_up.gone and (first.aborted, then.aborted) == (0, 1)
    stays = _Upstream()
    quiet = HangUp(_Hangs(3600).receive, stays.abort)
    await asyncio.sleep(0)
    quiet.close()  # the answer was relayed: the connection goes back to the pool, not closed
    await asyncio.sleep(0)
    assert stays.aborted == 0


async def test_without_autoload_only_an_asked_load_starts_a_model():
    """--no-models-autoload (llama-server's): a request for a model that is not running is a 400 in the route's
    shape saying how to load it; a loaded one answers; Ollama's load request (no prompt) is an asking."""
    class Counts(Pool):
        acquired: list[str] = []

        def state(self, name: str) -> str:
            return "loaded" if name in self.loaded_names else "unloaded"

        async def acquire(self, name: str, keep_alive: float | None = None) -> Runner:
            self.acquired.append(name)
            raise RunnerFailed("stop here: the request got as far as starting it")

    pool = Counts(["a", "b"], loaded_names=["b"])
    app = create_router_app(pool, RouterConfig(autoload=False))
    r = await _post(app, "/v1/chat/completions", {"model": "a", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and "POST /models/load" in r.json()["error"]["message"] and pool.acquired == []
    o = await _post(app, "/api/generate", {"model": "a", "prompt": "hi"})
    assert o.status_code == 400 and "--no-models-autoload" in o.json()["error"]
    assert (await _post(app, "/api/generate", {"model": "a"})).status_code == 500 and pool.acquired == ["a"]
    assert (await _post(app, "/infill", {"model": "b", "input_prefix": "x"})).status_code == 500
    assert (await _post(app, "/v1/completions?autoload=true", {"model": "a", "prompt": "x"})).status_code == 500
    assert pool.acquired == ["a", "b", "a"]  # llama-server's ?autoload= wins over the router's setting
    on = create_router_app(pool, RouterConfig())
    refused = await _post(on, "/v1/completions?autoload=false", {"model": "a", "prompt": "x"})
    assert refused.status_code == 400 and pool.acquired == ["a", "b", "a"]


async def test_models_reload_reads_the_catalog_again():
    """llama-server's GET /models?reload=1 (after editing the presets file): the router lists its models anew."""
    class Listed(Pool):
        def status(self) -> list[Status]:
            return []  # the entries' shape is test_router_api's

    reads: list[bool] = []
    app = create_router_app(Listed(["a"]), RouterConfig(), rediscover=lambda: reads.append(True))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as c:
        assert (await c.get("/models")).status_code == 200 and reads == []
        listed = await c.get("/models", params={"reload": "1"})
    assert listed.status_code == 200 and listed.json()["object"] == "list" and reads == [True]


async def test_a_broken_presets_file_is_a_400_on_reload_naming_the_file(tmp_path):
    from localspec.engine.loader import EngineConfig
    from localspec.router.discover import discover

    bad = tmp_path / "presets.ini"
    bad.write_text("[coder\nmodel = x.gguf\n")
    app = create_router_app(Pool(["a"]), RouterConfig(), rediscover=lambda: discover(EngineConfig(), bad))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router") as c:
        r = await c.get("/models", params={"reload": "1"})
    assert r.status_code == 400 and f"cannot read the presets file {bad}" in r.json()["error"]["message"]


async def test_ollama_stop_unloads_without_loading_first():
    class Unloads(Pool):
        unloaded: list[str] = []

        async def unload(self, name: str) -> bool:
            self.unloaded.append(name)
            return True

        async def acquire(self, name: str, keep_alive: float | None = None) -> Runner:
            raise AssertionError("an unload request must not start the model")

    pool = Unloads(["a"])
    r = await _post(create_router_app(pool), "/api/generate", {"model": "a", "keep_alive": 0})
    assert r.status_code == 200 and r.json()["done_reason"] == "unload" and pool.unloaded == ["a"]


@dataclass
class Engine:
    model: str | None = None
    models_dirs: tuple[str, ...] = ()
    draft: str | None = None


def test_router_mode_unless_a_model_is_named():
    from localspec.commands.router_mode import wanted

    assert wanted(Engine(), False, None)  # plain `localspec serve`: every known model
    assert wanted(Engine(draft="lookup"), False, None)  # --lookup: the same for every runner
    assert not wanted(Engine(draft="/m/drafter.gguf"), False, None)  # a drafter for the default target
    assert wanted(Engine(models_dirs=("/m",)), False, None) and wanted(Engine(), True, None)
    assert not wanted(Engine("x", ("/m",)), False, None)  # --model X --models-dir D: D holds drafters
    with pytest.raises(click.UsageError):
        wanted(Engine("x"), True, None)


def test_runners_get_the_per_request_options_the_user_gave():
    from localspec.commands.router_mode import keep_alive_seconds, serve_args
    from localspec.commands.serve import serve

    ctx = serve.make_context("serve", ["--max-predict", "64", "-n", "12", "--context-shift", "--port", "9",
                                       "--api-key", "k"])
    assert serve_args(ctx) == ("--max-predict", "64", "--n-predict", "12", "--context-shift")
    template = Path(__file__).parent / "templates" / "qwen2.5.jinja"
    ctx = serve.make_context("serve", ["--chat-template-file", str(template), "--reasoning-format", "none",
                                       "--reasoning", "off"])
    assert serve_args(ctx) == ("--chat-template-file", str(template), "--reasoning-format", "none",
                               "--reasoning", "off")
    assert keep_alive_seconds("5m") == 300.0 and keep_alive_seconds("-1") == FOREVER
    with pytest.raises(click.BadParameter):
        keep_alive_seconds("later")


async def test_props_of_a_sleeping_model_do_not_wake_it():
    transport = httpx.ASGITransport(app=create_router_app(Pool(["a"])))  # acquire would fail: no runner
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:
        r = await c.get("/props", params={"model": "a"})
        assert r.json()["is_sleeping"] is True and r.json()["status"] == "sleeping"
        assert (await c.get("/props")).json()["role"] == "router"
        assert (await c.get("/metrics", params={"model": "a"})).text.startswith("# model a is sleeping")
