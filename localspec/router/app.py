"""Router mode's FastAPI app: every protocol route of a runner, forwarded to the runner of the model the request
names, and the router's own routes (routes.py: /models, /props, /api/tags, /api/ps, /api/pull ...).

Why a catch-all instead of one route per protocol route: the runner is a whole `localspec serve`, so the router
need not know each route's body; it reads only the `model` field (Ollama's /api/show also says `name`) and
`keep_alive`. A request without a model goes to --default-model, else to the one loaded model, else to the
first known one (llama.vim sends no model to /infill). Errors come in the caller's protocol shape
(server/app.error_body, by path); an unknown model is a 404 that lists the known ones.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable
from urllib.parse import parse_qsl

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..errors import LocalspecError
from ..server.channel import hold_key
from ..server.http import ApiKeyMiddleware, CorsMiddleware, error_body, key_given
from . import routes
from .errors import NotLoaded, RouterError, RunnerFailed, UnknownModel, WontFit
from .handoff import holds
from .pool import FAILED, UNLOADED
from .proxy import forward
from .relay import Upstreams

log = logging.getLogger("localspec.router")
FOREVER = -1.0  # Ollama: a negative keep_alive keeps the model loaded


@dataclass(frozen=True)
class RouterConfig:
    """The router's own settings (a runner's come through its command line)."""

    api_key: str | None = None
    cors_origins: str = "localhost"
    default_model: str | None = None  # --default-model: for requests that name no model
    fallback_model: str | None = None  # the registry's default, when no model is named and several are loaded
    models_max: int = 4
    sleep_idle_s: float | None = None
    keep_alive_s: float = 300.0  # Ollama's default (OLLAMA_KEEP_ALIVE=5m)
    autoload: bool = True  # llama-server's --models-autoload: a request may start its model's runner


_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: Any) -> float | None:
    """Ollama's keep_alive: a number of seconds or a Go duration ("5m", "1h30m", "-1m"); negative = forever,
    0 = unload after the request; None (absent) = the router's default. Raises ValueError for anything else."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError(f"keep_alive must be a duration or a number of seconds, got {value!r}")
    if isinstance(value, (int, float)):
        return FOREVER if value < 0 else float(value)
    text = str(value).strip()
    sign, text = (-1.0, text[1:]) if text.startswith("-") else (1.0, text)
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION.findall(text)
        if not parts or "".join(n + u for n, u in parts) != text:
            raise ValueError(f"keep_alive: cannot read {value!r} as a duration (e.g. \"5m\", \"30s\", 0, -1)") from None
        seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    return FOREVER if sign < 0 and seconds > 0 else seconds


def requested_model(body: dict[str, Any]) -> str | None:
    name = body.get("model") or body.get("name")
    return name if isinstance(name, str) and name else None


def choose_model(pool: Any, config: RouterConfig, name: str | None) -> str:
    """The model a request is for: its own name (the pool resolves Ollama's ':latest' and aliases), else
    --default-model, else the one loaded model, else the registry's default, else the first known.
    Raises UnknownModel, which lists the known ones."""
    if name is not None:
        return str(pool.resolve(name))
    if config.default_model:
        return str(pool.resolve(config.default_model))
    loaded = pool.loaded()
    if len(loaded) == 1:
        return str(loaded[0])
    known = pool.known()
    if config.fallback_model in known:
        return str(config.fallback_model)
    if not known:
        raise UnknownModel("(none given)", known)
    return str(known[0])


def autoload(scope: dict, config: RouterConfig) -> bool:
    """Whether this request may start its model: `?autoload=true|1|false` (llama-server's), else the router's
    --models-autoload."""
    query = dict(parse_qsl((scope.get("query_string") or b"").decode("latin-1")))
    if "autoload" not in query:
        return config.autoload
    return query["autoload"] in ("true", "1")


def is_load_request(path: str, body: dict[str, Any]) -> bool:
    """Ollama's load (or, with keep_alive 0, unload) request: /api/generate or /api/chat with nothing to say."""
    if path == "/api/generate":
        return not body.get("prompt") and not body.get("suffix")
    return path == "/api/chat" and not body.get("messages")


def unload_answer(path: str, name: str) -> dict[str, Any]:
    """What Ollama answers an unload request: done, done_reason "unload", nothing generated."""
    now = datetime.now(timezone.utc).isoformat()
    said = {"message": {"role": "assistant", "content": ""}} if path == "/api/chat" else {"response": ""}
    return {"model": name, "created_at": now, **said, "done": True, "done_reason": "unload"}


def _json_body(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except ValueError as e:
        raise ValueError(f"malformed JSON body: {e}") from None
    return value if isinstance(value, dict) else {}


OWN_POSTS = frozenset({"/models/load", "/models/unload", "/api/pull"})  # the router's own POST routes (routes.py)


def create_router_app(pool: Any, config: RouterConfig = RouterConfig(),
                      rediscover: Callable[[], None] | None = None) -> Any:
    """The ASGI app over `pool` (router/pool.py's Pool): see build_router."""
    return build_router(pool, config, rediscover).app


@dataclass
class Hops:
    """How the forwarded requests reached their runners, counted for GET /props (`hops`): the caller's connection
    handed over from the router's read callback (`early`) or from the ASGI path after a wait (a load), the
    answer relayed (a browser's request, no hand-off on this platform), or the request read by the runner itself
    on a connection it held (`held`: it never reached the router)."""

    handed_early: int = 0
    handed: int = 0
    relayed: int = 0
    held: int = 0


@dataclass(frozen=True)
class Router:
    app: Any  # the ASGI app uvicorn serves
    forwarder: "Forwarder"  # its try_hand is the front protocol's hook (router/handoff.py)


def build_router(pool: Any, config: RouterConfig = RouterConfig(),
                 rediscover: Callable[[], None] | None = None) -> Router:
    """The ASGI app over `pool`, whose runners start on demand and stop with the app. `rediscover` lists the
    models again (after /api/pull and /api/delete change the hub cache). Every POST but the router's own goes
    to `Forwarder` as raw ASGI, past FastAPI's routing (the hop's cost, proxy.py); the rest is a FastAPI app
    (routes.py, /docs)."""
    upstreams = Upstreams()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        reaper = asyncio.create_task(pool.run_reaper())
        try:
            yield
        finally:
            reaper.cancel()
            await pool.close()
            upstreams.close()

    api = FastAPI(title="localspec router", version=__version__, lifespan=lifespan,
                  description="one localspec serve process per model, behind llama.cpp/OpenAI/Ollama routes")
    hops = Hops()
    api.include_router(routes.router(pool, config, upstreams, rediscover, hops))
    _error_handlers(api)
    forwarder = Forwarder(api, pool, config, upstreams, hops)
    app: Any = forwarder
    if config.api_key:
        app = ApiKeyMiddleware(app, key=config.api_key)
    app = CorsMiddleware(app, origins=config.cors_origins)  # outermost: preflight never meets the key
    return Router(app, forwarder)


class Forwarder:
    """Every protocol route of a runner (any POST the router does not answer itself): pick the model, start
    its runner if need be, hand the caller's connection over (router/handoff.py) or forward. Other requests go
    to `api`."""

    def __init__(self, api: FastAPI, pool: Any, config: RouterConfig, upstreams: Upstreams,
                 hops: Hops | None = None) -> None:
        self.api, self.pool, self.config, self.upstreams = api, pool, config, upstreams
        self.hops = hops or Hops()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] in OWN_POSTS:
            return await self.api(scope, receive, send)
        path, started = scope["path"], False

        async def sending(message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.forward(scope, receive, sending, await _read_body(receive))
        except Exception as e:  # the caller gets its protocol's shape, when nothing was sent yet
            if started:
                raise
            await caller_error(path, e)(scope, receive, send)

    def _plan(self, scope: dict, raw: bytes) -> tuple[str, dict[str, Any], float | None]:
        """The request's model, body and keep_alive (Ollama's routes only). Raises ValueError, UnknownModel."""
        path = scope["path"]
        body = _json_body(raw)
        keep_alive = parse_keep_alive(body.get("keep_alive")) if path.startswith("/api/") else None
        return choose_model(self.pool, self.config, requested_model(body)), body, keep_alive

    def _hold(self, scope: dict, body: dict[str, Any], runner: Any) -> tuple[Any, ...]:
        """The hold key and `again` for a request its runner may keep the connection after (router/handoff.py):
        each next request it answers there takes the model again, as try_acquire would."""
        key = hold_key(scope["path"], scope["headers"], body) if holds() else None
        if key is None:
            return ()

        def again() -> Callable[[], None]:
            self.hops.held += 1
            return self._releaser(runner, None) if self.pool.retake(runner) else _nothing

        return key, again

    def _releaser(self, runner: Any, keep_alive: float | None) -> Callable[[], None]:
        released = False

        def done() -> None:
            nonlocal released
            if not released:
                released = True
                self.pool.release(runner, keep_alive)

        return done

    def try_hand(self, scope: dict, raw: bytes) -> bool:
        """The whole forward, synchronously, in the caller's read callback (router/handoff.py's Front) when it
        needs nothing to wait for: a loaded model, a request the router's middleware would pass unchanged, and a
        runner that takes the connection. False leaves the request to the ASGI path, which also answers every
        error in the caller's protocol shape."""
        if scope["path"] in OWN_POSTS or (self.config.api_key and not key_given(scope, self.config.api_key.encode())):
            return False
        try:
            name, body, keep_alive = self._plan(scope, raw)
        except (ValueError, RouterError):
            return False
        if keep_alive == 0 and is_load_request(scope["path"], body):
            return False
        runner = self.pool.try_acquire(name, keep_alive)
        if runner is None:
            return False
        channel = getattr(runner, "channel", None)
        if channel is not None and channel.hand(scope, raw, name, self._releaser(runner, keep_alive),
                                                *self._hold(scope, body, runner)):
            self.hops.handed_early += 1
            return True
        self.pool.release(runner, keep_alive)
        return False

    async def forward(self, scope, receive, send, raw: bytes) -> None:
        path, pool = scope["path"], self.pool
        name, body, keep_alive = self._plan(scope, raw)
        if keep_alive == 0 and is_load_request(path, body):  # `ollama stop MODEL`
            await pool.unload(name)
            return await JSONResponse(unload_answer(path, name))(scope, receive, send)
        if not autoload(scope, self.config) and pool.state(name) in (UNLOADED, FAILED) \
                and not is_load_request(path, body):
            raise NotLoaded(name)  # Ollama's load request (no prompt) is the asking, as /models/load is
        runner = await pool.acquire(name, keep_alive)
        done = self._releaser(runner, keep_alive)
        channel = getattr(runner, "channel", None)
        if channel is not None and channel.hand(scope, raw, name, done, *self._hold(scope, body, runner)):
            self.hops.handed += 1
            return
        self.hops.relayed += 1
        await forward(self.upstreams, scope, receive, send, runner, raw, name, done)


def _nothing() -> None:
    pass


async def _read_body(receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ValueError("the client hung up before sending the whole body")
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(parts)


def router_error(path: str, exc: RouterError) -> JSONResponse:
    """A pool refusal in the caller's shape: an unknown model is a 404, one not loaded under
    --no-models-autoload a 400, one that will not fit a 503 (nothing idle can make room now), a runner that
    failed to start a 500 naming its cause."""
    if isinstance(exc, UnknownModel):
        known = ", ".join(exc.known) or "none"
        return error_body(path, 404, f"model '{exc.name}' not found; known models: {known} (GET /models lists "
                          "them)", "not_found_error")
    if isinstance(exc, NotLoaded):
        return error_body(path, 400, str(exc))
    if isinstance(exc, WontFit):
        return error_body(path, 503, str(exc), "unavailable_error")
    if isinstance(exc, RunnerFailed) and path.startswith("/api/"):
        return error_body(path, 500, f"llama runner process has terminated: {exc}", "server_error")
    return error_body(path, 500, str(exc), "server_error")


def caller_error(path: str, exc: Exception) -> JSONResponse:
    """Any error the router raises, in the caller's shape: a pool refusal (router_error), a bad value (400),
    else a bug (500, logged). The one mapping for the forwarded POSTs and the FastAPI routes alike."""
    if isinstance(exc, RouterError):
        return router_error(path, exc)
    if isinstance(exc, (ValueError, LocalspecError)):  # a bad value, or a file of the user's (a presets file)
        return error_body(path, 400, str(exc))
    log.exception("unhandled error on %s", path, exc_info=exc)
    return error_body(path, 500, f"internal error: {type(exc).__name__}: {exc}", "server_error")


def _error_handlers(app: FastAPI) -> None:
    async def failed(request: Request, exc: Exception) -> JSONResponse:
        return caller_error(request.url.path, exc)

    # a RouterError is a LocalspecError; Exception's own handler runs outermost, and re-raises
    for kind in (ValueError, LocalspecError, Exception):
        app.add_exception_handler(kind, failed)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        msg = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code in (404, 405):
            msg = f"no route {request.method} {request.url.path} in router mode (see /docs)"
        return error_body(request.url.path, exc.status_code, msg,
                          "not_found_error" if exc.status_code == 404 else "invalid_request_error")
