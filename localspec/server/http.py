"""The HTTP pieces with no model behind them: the errors a request can end in (ApiError, ClientGone) and each
protocol's error body, the API key, JSON bodies and CORS.

Why a module of its own: router mode (localspec/router/) answers errors and guards its routes exactly as the
single-model server does, and must not load llama.cpp to do so; this module imports nothing of the engine.
Error shapes: Ollama's `{"error": "..."}` under /api/, Anthropic's `{"type": "error", "error": {"type",
"message"}}` under /v1/messages, llama-server's and OpenAI's `{"error": {"code", "message", "type"}}` elsewhere.
CORS follows llama-server: by default a browser page on a localhost origin may call every route (preflight
included, before the API key check: browsers send no credentials on it).
"""

from __future__ import annotations

import hmac
from typing import Any
from urllib.parse import urlsplit

from fastapi.responses import JSONResponse, Response

from ..errors import LocalspecError


class ApiError(LocalspecError):
    """A client error with its HTTP status; the app renders it in the protocol's error shape."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


class ClientGone(Exception):
    """The client disconnected before its job started; nobody is left to answer."""


PUBLIC = {"/health", "/v1/health"}
ERROR_TYPES = {"invalid_request_error", "authentication_error", "permission_error", "not_found_error",
               "request_too_large", "rate_limit_error", "api_error", "overloaded_error"}


def anthropic_error(status: int, message: str, kind: str) -> dict[str, Any]:
    """Anthropic's error body; our kinds that Anthropic lacks become its nearest (api_error for a 5xx)."""
    t = kind if kind in ERROR_TYPES else ("api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": t, "message": message}}


def error_body(path: str, status: int, message: str, kind: str = "invalid_request_error",
               **fields: Any) -> JSONResponse:
    if path.startswith("/api/"):
        return JSONResponse({"error": message}, status_code=status)
    if path.startswith("/v1/messages"):  # Anthropic's shape: {"type": "error", "error": {"type", "message"}}
        return JSONResponse(anthropic_error(status, message, kind), status_code=status)
    return JSONResponse({"error": {"code": status, "message": message, "type": kind, **fields}}, status_code=status)


def key_given(scope: dict, key: bytes) -> bool:
    """Whether the request carries `key` as `Authorization: Bearer KEY` or `X-Api-Key: KEY`."""
    headers = dict(scope.get("headers", []))
    auth = headers.get(b"authorization", b"")
    given = auth[7:].strip() if auth[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
    return bool(given) and hmac.compare_digest(given, key)


class ApiKeyMiddleware:
    """Every route but /health needs `Authorization: Bearer KEY` (or `X-Api-Key: KEY`). Pure ASGI, so
    streaming responses and disconnect detection pass through untouched."""

    def __init__(self, app, key: str) -> None:
        self.app = app
        self.key = key.encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] in PUBLIC or key_given(scope, self.key):
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
    skips others; "*" allows every origin (echoed, as llama-server does); else a comma-separated list of allowed
    origins. A preflight (OPTIONS) is answered here, 200 with no body, whatever the route and the API key."""

    METHODS = "GET, POST, DELETE, OPTIONS"  # llama-server's

    def __init__(self, app, origins: str = "localhost") -> None:
        self.app = app
        self.origins = origins
        self.allowed = {o.strip().rstrip("/") for o in origins.split(",")}

    def allow(self, origin: str) -> str | None:
        if not origin:
            return None
        if self.origins == "*":  # the origin itself: browsers refuse "*" together with allow-credentials
            return origin
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


class HeldHeads:
    """An answer's head goes out with its first body piece, in a runner behind the router, for the answers the
    router relays.

    Why: a streamed answer's head is sent before the prompt is evaluated, so the router would wake for it just as
    the runner's llama.cpp threads take both cores of a small machine, and delay them; held, it arrives with the
    first token and the router wakes once (docs/bench/router.md#router-hop). A direct client gains nothing from
    it, so a single-model server sends heads at once, as llama-server does."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        held = None

        async def send_with_body(message) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                held = message
                return
            if held is not None:
                head, held = held, None
                await send(head)
            await send(message)

        await self.app(scope, receive, send_with_body)
