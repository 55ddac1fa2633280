"""Router mode's app: every protocol route of a runner, forwarded to the runner of the model the request names
(proxy.py), and the router's own routes (routes.py: /models, /props, /api/tags, /api/ps, /api/pull ...).

Why a catch-all instead of one route per protocol route: the runner is a whole `localspec serve`, so the router
need not know each route's body; it reads only the `model` field (Ollama's /api/show also says `name`) and
`keep_alive` (choice.py). Errors come in the caller's protocol shape (server/http.error_body, by path); an
unknown model is a 404 that lists the known ones.
"""

from __future__ import annotations

import asyncio
import json
import logging
from contextlib import asynccontextmanager
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import Response

from .. import __version__
from ..errors import LocalspecError
from ..server.http import ApiKeyMiddleware, CorsMiddleware, error_body
from ..server.limits import BodyLimitMiddleware
from . import routes
from .choice import (
    RouterConfig,
    autoload,
    choose_model,
    is_load_request,
    parse_keep_alive,
    requested_model,
    unload_answer,
)
from .pool import FAILED, UNLOADED
from .proxy import Client, HangUp, forward
from .refusals import NotLoaded, RouterError, RunnerFailed, UnknownModel, WontFit

log = logging.getLogger("localspec.router")


def _json_body(body: bytes) -> dict[str, Any]:
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except ValueError as e:
        raise ValueError(f"malformed JSON body: {e}") from None
    except RecursionError:  # 100,000 nested brackets: Python's parser gives up, as the runner's would
        raise ValueError("malformed JSON body: nested too deeply") from None
    return value if isinstance(value, dict) else {}


# the router's own POST routes (routes.py)
OWN_POSTS = frozenset({"/models", "/models/load", "/models/unload", "/api/pull"})


def create_router_app(pool: Any, config: RouterConfig = RouterConfig(),
                      rediscover: Callable[[], None] | None = None) -> Any:
    """The ASGI app over `pool` (pool.py's Pool), whose runners start on demand and stop with the app.
    `rediscover` lists the models again (after /api/pull and /api/delete change the hub cache). Every POST but
    the router's own goes to `Forwarder` as raw ASGI, past FastAPI's routing; the rest is a FastAPI app
    (routes.py, /docs)."""
    client = Client()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        reaper = asyncio.create_task(pool.run_reaper())
        try:
            yield
        finally:
            reaper.cancel()
            await pool.close()
            await client.close()

    api = FastAPI(title="localspec router", version=__version__, lifespan=lifespan,
                  description="one localspec serve process per model, behind llama.cpp/OpenAI/Ollama routes")
    api.include_router(routes.router(pool, config, client, rediscover))
    _error_handlers(api)
    app: Any = BodyLimitMiddleware(Forwarder(api, pool, config, client))
    if config.api_key:
        app = ApiKeyMiddleware(app, key=config.api_key)
    return CorsMiddleware(app, origins=config.cors_origins)  # outermost: preflight never meets the key


class Forwarder:
    """Every protocol route of a runner (any POST the router does not answer itself): pick the model, start its
    runner if need be, and forward the request to it. Other requests go to `api`."""

    def __init__(self, api: FastAPI, pool: Any, config: RouterConfig, client: Client) -> None:
        self.api, self.pool, self.config, self.client = api, pool, config, client

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

    async def forward(self, scope, receive, send, raw: bytes) -> None:
        path, pool = scope["path"], self.pool
        body = _json_body(raw)
        keep_alive = parse_keep_alive(body.get("keep_alive")) if path.startswith("/api/") else None
        name = choose_model(pool, self.config, requested_model(body))
        if keep_alive == 0 and is_load_request(path, body):  # `ollama stop MODEL`
            await pool.unload(name)
            return await JSONResponse(unload_answer(path, name))(scope, receive, send)
        if not autoload(scope, self.config) and pool.state(name) in (UNLOADED, FAILED) \
                and not is_load_request(path, body):
            raise NotLoaded(name)  # Ollama's load request (no prompt) is the asking, as /models/load is
        runner = await acquired(pool, name, keep_alive, receive)
        if runner is None:  # the caller hung up while its model waited in the load queue
            return await Response(status_code=499)(scope, receive, send)
        await forward(self.client, scope, receive, send, runner, raw, name,
                      lambda: pool.release(runner, keep_alive))


async def acquired(pool: Any, name: str, keep_alive: float | None, receive: Callable) -> Any:
    """The pool's runner for `name`, or None when the caller hangs up first: a wait in the load queue can be
    long, and a caller that left takes its place in line with it (its model's load is cancelled when no one
    else waits for it)."""
    task = asyncio.ensure_future(pool.acquire(name, keep_alive))
    hang_up = HangUp(receive, task.cancel)
    try:
        return await task
    except asyncio.CancelledError:
        if hang_up.gone and task.cancelled():
            return None
        if task.done() and not task.cancelled() and task.exception() is None:
            pool.release(task.result(), keep_alive)  # taken just as this request was cancelled: given back
        raise
    finally:
        hang_up.close()


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
    --no-models-autoload a 400, one that will not fit a 503 (after its wait in the load queue), a runner that
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
