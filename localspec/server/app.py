"""The FastAPI app: each protocol's routes over one generation worker, `/metrics`, the API key, and errors.

Every client error becomes a 4xx with a JSON body in the caller's protocol shape — Ollama's `{"error": "..."}`
under /api/, Anthropic's `{"type": "error", "error": {"type", "message"}}` under /v1/messages, llama-server's and
OpenAI's `{"error": {"code", "message", "type"}}` elsewhere — and never a 500.
CORS follows llama-server: by default a browser page on a localhost origin may call every route (preflight
included, before the API key check: browsers send no credentials on it).
"""

from __future__ import annotations

import hmac
import json
import logging
from contextlib import asynccontextmanager
from typing import Any
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..engine.engine import Engine
from ..errors import LocalspecError, ModelNotFound
from . import anthropic, llamacpp, ollama, openai, responses
from .anthropic_convert import anthropic_error
from .state import ApiError, ClientGone, ServerConfig, State, StateDep
from .worker import ExceedContext

log = logging.getLogger("localspec.server")
PUBLIC = {"/health", "/v1/health"}


def create_app(engine: Engine, config: ServerConfig = ServerConfig()) -> FastAPI:
    state = State(engine, config)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        state.worker.start()
        yield
        state.worker.stop()

    app = FastAPI(title="localspec", version=__version__, lifespan=lifespan,
                  description="llama.cpp-, OpenAI- and Ollama-compatible completion server with speculative decoding")
    app.state.localspec = state
    for module in (llamacpp, openai, ollama, anthropic, responses):
        app.include_router(module.router(state))

    app.add_api_route("/metrics", metrics, methods=["GET"], response_class=PlainTextResponse, tags=["metrics"])
    _error_handlers(app)
    app.add_middleware(JsonBodyMiddleware)
    if config.api_key:
        app.add_middleware(ApiKeyMiddleware, key=config.api_key)
    app.add_middleware(CorsMiddleware, origins=config.cors_origins)  # outermost: preflight never meets the key
    return app


async def metrics(state: StateDep) -> Response:
    """Prometheus text: the request counters and the speculative series (metrics.py), and the worker's load."""
    e = state.engine
    text = state.metrics.render(speculation_enabled=e.drafter is not None, queue_waiting=state.worker.waiting,
                                busy=state.worker.busy, kv_tokens=e.target.n_past, n_ctx=e.target.n_ctx)
    return PlainTextResponse(text, headers={"Process-Start-Time-Unix": str(int(state.started_at))})


def error_body(path: str, status: int, message: str, kind: str = "invalid_request_error",
               **fields: Any) -> JSONResponse:
    if path.startswith("/api/"):
        return JSONResponse({"error": message}, status_code=status)
    if path.startswith("/v1/messages"):  # Anthropic's shape: {"type": "error", "error": {"type", "message"}}
        return JSONResponse(anthropic_error(status, message, kind), status_code=status)
    return JSONResponse({"error": {"code": status, "message": message, "type": kind, **fields}}, status_code=status)


def _error_handlers(app: FastAPI) -> None:
    app.exception_handler(RequestValidationError)(invalid)
    app.exception_handler(StarletteHTTPException)(http_error)
    app.exception_handler(LocalspecError)(user_error)
    app.exception_handler(ClientGone)(client_gone)
    app.exception_handler(ValueError)(value_error)
    app.exception_handler(Exception)(bug)


async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_body(request.url.path, 400, _describe(exc.errors()))


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    msg = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
    if exc.status_code == 404:
        msg = f"no route {request.method} {request.url.path} (see /docs)"
    return error_body(request.url.path, exc.status_code, msg, "not_found_error" if exc.status_code == 404
                      else "invalid_request_error")


async def user_error(request: Request, exc: LocalspecError) -> JSONResponse:
    if isinstance(exc, ApiError):
        return error_body(request.url.path, exc.status, exc.message, exc.kind)
    if isinstance(exc, ExceedContext):
        return error_body(request.url.path, 400, str(exc), "exceed_context_size_error",
                          n_prompt_tokens=exc.n_prompt_tokens, n_ctx=exc.n_ctx)
    status = 404 if isinstance(exc, ModelNotFound) else 400
    return error_body(request.url.path, status, str(exc))


async def client_gone(request: Request, exc: ClientGone) -> Response:
    return Response(status_code=499)  # nginx's "client closed request": nobody reads it, the log does


async def value_error(request: Request, exc: ValueError) -> JSONResponse:
    return error_body(request.url.path, 400, str(exc))


async def bug(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s", request.url.path)
    return error_body(request.url.path, 500, f"internal error: {type(exc).__name__}: {exc}", "server_error")


def _describe(errors: Any) -> str:
    """pydantic's error list -> one line: 'body.n_predict: Input should be ... (got -5)'."""
    parts = []
    for e in list(errors)[:3]:
        if e.get("type") == "json_invalid":
            parts.append(f"malformed JSON body: {e.get('ctx', {}).get('error', e.get('msg'))}")
            continue
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body") or "body"
        got = e.get("input")
        shown = not isinstance(got, (dict, list, bytes)) and got is not None
        got_s = f" (got {json.dumps(got, default=str)[:60]})" if shown else ""
        parts.append(f"{loc}: {e.get('msg', 'invalid')}{got_s}")
    return "; ".join(parts) or "invalid request"


class ApiKeyMiddleware:
    """Every route but /health needs `Authorization: Bearer KEY` (or `X-Api-Key: KEY`). Pure ASGI, so
    streaming responses and disconnect detection pass through untouched."""

    def __init__(self, app, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC:
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", []))
        auth = headers.get(b"authorization", b"")
        given = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        if given and hmac.compare_digest(given, self.key):
            return await self.app(scope, receive, send)
        resp = error_body(scope["path"], 401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                          "authentication_error")
        await resp(scope, receive, send)


class JsonBodyMiddleware:
    """Treat a POST body as JSON whatever its Content-Type says, as llama-server does: `curl -d '{...}'` sends
    application/x-www-form-urlencoded, and editors' HTTP helpers often send no type at all."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            headers = [(k, v) for k, v in scope.get("headers", []) if k != b"content-type"]
            scope = dict(scope, headers=headers + [(b"content-type", b"application/json")])
        await self.app(scope, receive, send)


def _is_local(origin: str) -> bool:
    host = urlsplit(origin).hostname or ""
    return host in ("localhost", "127.0.0.1", "::1") or host.endswith(".localhost")


class CorsMiddleware:
    """llama-server's CORS rule. `origins`: "localhost" (the default) reflects an Origin on localhost and
    skips others; "*" allows every origin; else a comma-separated list of allowed origins. A preflight
    (OPTIONS) is answered here, 200 with no body, whatever the route and the API key."""

    METHODS = "GET, POST, DELETE, OPTIONS"  # llama-server's

    def __init__(self, app, origins: str = "localhost") -> None:
        self.app = app
        self.origins = origins
        self.allowed = {o.strip().rstrip("/") for o in origins.split(",")}

    def allow(self, origin: str) -> str | None:
        if not origin:
            return None
        if self.origins == "*":
            return "*"
        if self.origins == "localhost":
            return origin if _is_local(origin) else None
        return origin if origin.rstrip("/") in self.allowed else None

    def headers(self, allowed: str) -> list[tuple[bytes, bytes]]:
        """What llama-server sends an allowed origin, on the preflight and on the answer alike."""
        return [(b"access-control-allow-origin", allowed.encode("latin-1")), (b"vary", b"Origin"),
                (b"access-control-allow-credentials", b"true"),
                (b"access-control-allow-methods", self.METHODS.encode()),
                (b"access-control-allow-headers", b"*")]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", []))
        allowed = self.allow(headers.get(b"origin", b"").decode("latin-1"))
        if scope["method"] == "OPTIONS":
            h = {"Access-Control-Max-Age": "600"}
            if allowed:
                h.update({k.decode(): v.decode("latin-1") for k, v in self.headers(allowed)})
            return await Response(status_code=200, headers=h)(scope, receive, send)
        if not allowed:
            return await self.app(scope, receive, send)
        extra = self.headers(allowed)

        async def send_cors(message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message, headers=list(message.get("headers", [])) + extra)
            await send(message)

        await self.app(scope, receive, send_cors)
