"""The FastAPI app: each protocol's routes over one generation worker, `/metrics`, and the exception handlers.

Every client error becomes a 4xx with a JSON body in the caller's protocol shape (http.error_body) and never a
500; the API key, JSON-body and CORS middlewares are in http.py, which router mode shares.
"""

from __future__ import annotations

import json
import logging
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from .. import __version__
from ..engine.engine import Engine
from ..errors import LocalspecError, ModelNotFound
from .execution.worker import ExceedContext
from .http import ApiError, ApiKeyMiddleware, ClientGone, CorsMiddleware, HeldHeads, JsonBodyMiddleware, error_body
from .limits import BodyLimitMiddleware
from .protocols import llamacpp, ollama, openai, responses
from .protocols.anthropic import routes as anthropic
from .state import ServerConfig, State, StateDep

log = logging.getLogger("localspec.server")


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
    app.add_middleware(BodyLimitMiddleware)  # inside the key: a client without it makes the server read nothing
    if config.hold_heads:
        app.add_middleware(HeldHeads)
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
